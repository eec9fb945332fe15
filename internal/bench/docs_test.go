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
	files, err := filepath.Glob(filepath.Join("..", "..", "docs", "results", "*.json"))
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

// README markers around the figure table that WriteSummary renders.
const (
	readmeBegin = "<!-- figures: rendered from the result files of docs/results by `pinmem report --format summary FILE...`; do not edit -->\n"
	readmeEnd   = "<!-- end of figures -->\n"
)

// TestDocsAreRendered: docs/PERF.md and the README's figure table are
// exactly what the committed JSON renders, so that no figure in them is
// written by hand (PINMEM_UPDATE_DOCS=1 rewrites them), and the shipped
// reports name the commit they measured.
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
	var perf, summary bytes.Buffer
	if err := WriteMarkdown(&perf, reps); err != nil {
		t.Fatal(err)
	}
	if err := WriteSummary(&summary, reps); err != nil {
		t.Fatal(err)
	}
	perfPath := filepath.Join("..", "..", "docs", "PERF.md")
	readmePath := filepath.Join("..", "..", "README.md")
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	pre, rest, ok1 := strings.Cut(string(readme), readmeBegin)
	_, post, ok2 := strings.Cut(rest, readmeEnd)
	if !ok1 || !ok2 {
		t.Fatalf("README.md lacks the figure markers %q ... %q", readmeBegin, readmeEnd)
	}
	wantReadme := pre + readmeBegin + summary.String() + readmeEnd + post
	if os.Getenv("PINMEM_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(perfPath, perf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(readmePath, []byte(wantReadme), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(perfPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, perf.Bytes()) {
		t.Errorf("docs/PERF.md is not what docs/results renders: run pinmem report --format markdown docs/results/*.json -o docs/PERF.md (or PINMEM_UPDATE_DOCS=1 go test -run TestDocsAreRendered ./internal/bench)")
	}
	if string(readme) != wantReadme && os.Getenv("PINMEM_UPDATE_DOCS") != "1" {
		t.Errorf("README.md's figure table is not what docs/results renders (PINMEM_UPDATE_DOCS=1 go test -run TestDocsAreRendered ./internal/bench)")
	}
}
