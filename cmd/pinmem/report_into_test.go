package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// shippedResults returns the result files of docs/results.
func shippedResults(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "docs", "results", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		if !strings.HasSuffix(f, ".schema.json") && filepath.Base(f) != "doctor.json" {
			out = append(out, f)
		}
	}
	return out
}

// TestReportIntoRendersTheReadme: report --into rewrites a README whose
// figure table and claims were edited by hand back to what the shipped
// results render (the README as committed), and refuses an unknown claim.
func TestReportIntoRendersTheReadme(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	claim := regexp.MustCompile(`(<!-- claim [a-z]+ -->)(?s:.*?)(<!-- /claim -->)`)
	edited := claim.ReplaceAllString(string(readme), "${1}near-pinned speed${2}")
	edited = strings.Replace(edited, "| bw | pinned | h2d |", "| bw | pinned | h2d | 99 |", 1)
	if edited == string(readme) {
		t.Fatal("README.md has no claim to edit")
	}
	doc := writeFile(t, t.TempDir(), "README.md", edited)
	args := append([]string{"report", "--into", doc}, shippedResults(t)...)
	if _, stderr, code := cli(t, args...); code != 0 {
		t.Fatalf("report --into: exit %d: %s", code, stderr)
	}
	got, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(readme) {
		t.Errorf("report --into did not render README.md as committed (run pinmem report --into README.md docs/results/*.json)")
	}

	bad := writeFile(t, t.TempDir(), "bad.md", "x <!-- claim bogus -->y<!-- /claim -->\n")
	_, stderr, code := cli(t, append([]string{"report", "--into", bad}, shippedResults(t)...)...)
	if code != exitUsage || !strings.Contains(stderr, `unknown claim "bogus"`) {
		t.Errorf("unknown claim: exit %d, %q; want %d naming it", code, stderr, exitUsage)
	}
	_, stderr, code = cli(t, append([]string{"report", "--into", bad, "--format", "json"}, shippedResults(t)...)...)
	if code != exitUsage || !strings.Contains(stderr, "--format does not apply") {
		t.Errorf("--into with --format: exit %d, %q; want %d", code, stderr, exitUsage)
	}
}
