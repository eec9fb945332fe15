package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// shippedReports reads every result file under docs/results (doctor's
// report is not a result file).
func shippedReports(t *testing.T) ([]Report, []string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "docs", "results", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var reps []Report
	var names []string
	for _, f := range files {
		if filepath.Base(f) == "doctor.json" || strings.HasSuffix(f, ".schema.json") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := ReadReport(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		reps = append(reps, rep)
		names = append(names, f)
	}
	if len(reps) == 0 {
		t.Fatal("docs/results holds no result files")
	}
	return reps, names
}

// TestDocsAreRendered: docs/PERF.md, the README's figure table and its
// claims are exactly what the committed JSON renders, so that no figure
// in them is written by hand (PINMEM_UPDATE_DOCS=1 rewrites them), and the
// shipped reports name the commit they measured.
func TestDocsAreRendered(t *testing.T) {
	reps, names := shippedReports(t)
	for i, r := range reps {
		if r.Meta.Tool.Revision == "" {
			t.Errorf("%s: no meta.tool.revision: a shipped figure must name its commit", names[i])
		}
		if IsFakeDevice(r.Meta.Device) {
			t.Errorf("%s: measured on the fake driver: never shipped", names[i])
		}
	}
	var perf bytes.Buffer
	if err := WriteMarkdown(&perf, reps); err != nil {
		t.Fatal(err)
	}
	perfPath := filepath.Join("..", "..", "..", "docs", "PERF.md")
	readmePath := filepath.Join("..", "..", "..", "README.md")
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), FiguresBegin) || !strings.Contains(string(readme), FiguresEnd) {
		t.Fatalf("README.md lacks the figure markers %q ... %q", FiguresBegin, FiguresEnd)
	}
	for _, name := range ClaimNames() {
		if !strings.Contains(string(readme), "<!-- claim "+name+" -->") {
			t.Errorf("README.md does not state the claim %q", name)
		}
	}
	wantReadme, err := FillDoc(readme, reps)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("PINMEM_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(perfPath, perf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(readmePath, wantReadme, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(perfPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, perf.Bytes()) {
		t.Errorf("docs/PERF.md is not what docs/results renders: run pinmem report --format markdown docs/results/*.json -o docs/PERF.md (or PINMEM_UPDATE_DOCS=1 go test -run TestDocsAreRendered ./internal/tools/bench)")
	}
	if !bytes.Equal(readme, wantReadme) && os.Getenv("PINMEM_UPDATE_DOCS") != "1" {
		t.Errorf("README.md's figure table or claims are not what docs/results renders: run pinmem report --into README.md docs/results/*.json (or PINMEM_UPDATE_DOCS=1 go test -run TestDocsAreRendered ./internal/tools/bench)")
	}
}
