package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/pinmem/pinmem/internal/tools/bench"
)

// compareSchema compiles docs/results/compare.schema.json (which refers
// to the result file's schema).
func compareSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	var id string
	for _, name := range []string{"result.schema.json", "compare.schema.json"} {
		f, err := os.Open(filepath.Join("..", "..", "docs", "results", name))
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		id = doc.(map[string]any)["$id"].(string)
		if err := c.AddResource(id, doc); err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.Compile(id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// slowerCopy writes a copy of the fixture bw.json with every result's
// figures times f.
func slowerCopy(t *testing.T, f float64) string {
	t.Helper()
	a := readReport(t, fixture("bw.json"))
	rs := slices.Clone(a.Results)
	for i := range rs {
		rs[i].Median, rs[i].Min, rs[i].Max = rs[i].Median*f, rs[i].Min*f, rs[i].Max*f
	}
	var buf bytes.Buffer
	if err := bench.WriteJSON(&buf, a.Meta, rs); err != nil {
		t.Fatal(err)
	}
	return writeFile(t, t.TempDir(), "slow.json", buf.String())
}

// TestCompareRegressionsLine: many regressions give a count and the worst
// five on the last line, every one with -v; the table marks each.
func TestCompareRegressionsLine(t *testing.T) {
	slow := slowerCopy(t, 0.5)
	stdout, stderr, code := cli(t, "compare", fixture("bw.json"), slow, "--threshold", "5%")
	n := strings.Count(stdout, "REGRESSION")
	if code != exitProblem || n <= worstRegressions {
		t.Fatalf("exit %d, %d regressions in the table: %s", code, n, stderr)
	}
	named := regexp.MustCompile(`\d\.\d{3}x`).FindAllString(stderr, -1)
	if !strings.Contains(stderr, "regression(s) beyond 5%; the worst 5: ") || len(named) != worstRegressions ||
		!strings.Contains(stderr, "-v lists every one") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("without -v: %q", stderr)
	}
	_, stderr, code = cli(t, "compare", fixture("bw.json"), slow, "--threshold", "5%", "-v")
	if named := regexp.MustCompile(`\d\.\d{3}x`).FindAllString(stderr, -1); code != exitProblem || len(named) != n {
		t.Errorf("-v names %d of %d regressions: %q", len(named), n, stderr)
	}
}

// TestCompareJSONSchema: compare's JSON is snake_case and matches
// docs/results/compare.schema.json; Go field names are refused by it.
func TestCompareJSONSchema(t *testing.T) {
	s := compareSchema(t)
	stdout, stderr, code := cli(t, "compare", fixture("bw.json"), slowerCopy(t, 0.9), "--format", "json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if err := validate(t, s, "compare", []byte(stdout)); err != nil {
		t.Errorf("compare --format json: %v", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(stdout), &top); err != nil {
		t.Fatal(err)
	}
	for k := range top {
		if k != strings.ToLower(k) {
			t.Errorf("key %q is not snake_case", k)
		}
	}
	old := strings.Replace(stdout, `"meta_a"`, `"MetaA"`, 1)
	if err := validate(t, s, "old", []byte(old)); err == nil {
		t.Error("the schema accepts Go field names")
	}
}

// TestExitTableListsNoResultInCommon: compare of files with no result in
// common exits 1, which the exit status table of --help and the README
// list.
func TestExitTableListsNoResultInCommon(t *testing.T) {
	if _, _, code := cli(t, "compare", fixture("bw.json"), fixture("zerocopy.json")); code != exitProblem {
		t.Errorf("exit %d, want %d", code, exitProblem)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(exitHelp, "compare found no result in common") ||
		!strings.Contains(string(readme), "| 1 | measurement problem:") || !strings.Contains(string(readme), "`compare` of files with no result in common") {
		t.Error("the exit status tables do not list compare's no result in common under 1")
	}
}
