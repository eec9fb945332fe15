package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// fixtureReports reads the named report fixtures of testdata.
func fixtureReports(t *testing.T, names ...string) []Report {
	t.Helper()
	var reps []Report
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join("testdata", n))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := ReadReport(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		reps = append(reps, rep)
	}
	return reps
}

// golden compares got with testdata/golden/name (go test -update rewrites it).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run %s -update writes it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from a fresh rendering of the fixtures (go test -run %s -update rewrites it after a deliberate change)", path, t.Name())
	}
}

// TestGoldenMarkdown: the markdown of the fixtures' run (PERF.md's form)
// and its headline table are exactly the golden files.
func TestGoldenMarkdown(t *testing.T) {
	reps := fixtureReports(t, "bw.json", "pin.json", "overlap.json", "zerocopy.json")
	var md, sum bytes.Buffer
	if err := WriteMarkdown(&md, reps); err != nil {
		t.Fatal(err)
	}
	if err := WriteSummary(&sum, reps); err != nil {
		t.Fatal(err)
	}
	golden(t, "run.md", md.Bytes())
	golden(t, "summary.md", sum.Bytes())
}

// TestGoldenCSV: the CSV of two fixture files names each row's file and
// device and carries its reference.
func TestGoldenCSV(t *testing.T) {
	reps := fixtureReports(t, "bw.json", "pin.json")
	var b bytes.Buffer
	if err := WriteCSV(&b, CSVSource{"bw.json", reps[0].Meta, reps[0].Results}, CSVSource{"pin.json", reps[1].Meta, reps[1].Results}); err != nil {
		t.Fatal(err)
	}
	golden(t, "reports.csv", b.Bytes())
}

// TestGoldenPlots: the SVG plots of the fixtures, caption and bound lines
// included, are exactly the golden files.
func TestGoldenPlots(t *testing.T) {
	for _, name := range []string{"bw", "overlap", "zerocopy"} {
		rep := fixtureReports(t, name+".json")[0]
		var b bytes.Buffer
		if err := WritePlot(&b, ImageSVG, rep.Meta, rep.Results); err != nil {
			t.Fatal(err)
		}
		golden(t, name+".svg", b.Bytes())
	}
}
