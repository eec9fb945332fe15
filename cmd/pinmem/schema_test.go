package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// schemas compiles docs/results' JSON Schemas: the result file's and
// doctor's (which refers to the result file's tool).
func schemas(t *testing.T) (result, doctor *jsonschema.Schema) {
	t.Helper()
	c := jsonschema.NewCompiler()
	ids := map[string]string{}
	for _, name := range []string{"result.schema.json", "doctor.schema.json"} {
		f, err := os.Open(filepath.Join("..", "..", "docs", "results", name))
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		id := doc.(map[string]any)["$id"].(string)
		if err := c.AddResource(id, doc); err != nil {
			t.Fatal(err)
		}
		ids[name] = id
	}
	var err error
	if result, err = c.Compile(ids["result.schema.json"]); err != nil {
		t.Fatal(err)
	}
	if doctor, err = c.Compile(ids["doctor.schema.json"]); err != nil {
		t.Fatal(err)
	}
	return result, doctor
}

func validate(t *testing.T, s *jsonschema.Schema, name string, data []byte) error {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s.Validate(inst)
}

// TestShippedResultsMatchSchema: every result file shipped in docs/results
// and every fixture matches docs/results/result.schema.json; a file the
// schema must refuse is refused.
func TestShippedResultsMatchSchema(t *testing.T) {
	result, _ := schemas(t)
	shipped, _ := filepath.Glob(filepath.Join("..", "..", "docs", "results", "*.json"))
	fixtures, _ := filepath.Glob(fixture("*.json"))
	n := 0
	for _, f := range append(shipped, fixtures...) {
		base := filepath.Base(f)
		if base == "doctor.json" || strings.HasSuffix(base, ".schema.json") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate(t, result, f, data); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		n++
	}
	if n < 6 {
		t.Errorf("validated %d files", n)
	}
	bad := `{"meta":{"schema_version":1,"tool":{"name":"pinmem","version":"x","modified":false,"go_version":"go"},"partial":false,"host":{"os":"linux","cores":1}},
		"results":[{"bench":"bw","kind":"pinned","dir":"h2d","size":1,"unit":"furlongs","median":1,"min":1,"max":1,"samples":1,"verified":true,"timing":"wall","skipped":false,"verify_failed":false}]}`
	if err := validate(t, result, "bad", []byte(bad)); err == nil {
		t.Error("a unit outside the schema was accepted")
	}
}

// TestFreshOutputMatchesSchema: what bench (on the fake driver, with the
// copier's path and every row's reference) and doctor write match their
// schemas.
func TestFreshOutputMatchesSchema(t *testing.T) {
	result, doctor := schemas(t)
	testutil.UseFake(t, fakedrv.Options{})
	stdout, stderr, code := cli(t, "bench", "--kinds", "copier,pageable-sync", "--sizes", "64KiB", "--samples", "1", "--format", "json")
	if code != exitOK {
		t.Fatalf("bench: %d %s", code, stderr)
	}
	if !strings.Contains(stdout, `"path"`) || !strings.Contains(stdout, `"ref": "pageable-sync"`) {
		t.Errorf("bench JSON lacks the copier's path or its reference:\n%s", stdout)
	}
	if err := validate(t, result, "bench", []byte(stdout)); err != nil {
		t.Errorf("bench: %v", err)
	}
	stdout, stderr, code = cli(t, "doctor", "--format", "json")
	if code != exitOK {
		t.Fatalf("doctor: %d %s", code, stderr)
	}
	if err := validate(t, doctor, "doctor", []byte(stdout)); err != nil {
		t.Errorf("doctor: %v\n%s", err, stdout)
	}
	if !strings.Contains(stdout, `"memory_bytes"`) {
		t.Errorf("doctor JSON names no device memory:\n%s", stdout)
	}
	// -o FILE.json takes JSON from the name, as a first-time user writes it.
	path := filepath.Join(t.TempDir(), "doctor.json")
	if _, stderr, code := cli(t, "doctor", "-o", path); code != exitOK {
		t.Fatalf("doctor -o %s: %d %s", path, code, stderr)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate(t, doctor, path, data); err != nil {
		t.Errorf("doctor -o doctor.json: %v\n%s", err, data)
	}
}

// TestReportShippedDirectory: the documented command, `pinmem report
// --format markdown docs/results/*.json`, renders docs/PERF.md although
// the glob takes in the JSON Schemas (and, after a run, doctor's report),
// each left out with a line; a doctor report alone is refused.
func TestReportShippedDirectory(t *testing.T) {
	dir := filepath.Join("..", "..", "docs", "results")
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	doctor := filepath.Join(t.TempDir(), "doctor.json")
	if _, stderr, code := cli(t, "doctor", "-o", doctor); code != exitOK {
		t.Fatalf("doctor: %d %s", code, stderr)
	}
	md, stderr, code := cli(t, append([]string{"report", "--format", "markdown", doctor}, files...)...)
	if code != exitOK {
		t.Fatalf("report --format markdown docs/results/*.json: exit %d, %s", code, stderr)
	}
	for _, want := range []string{"skipping " + doctor + ": pinmem doctor's report", "result.schema.json: a JSON Schema"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	perf, err := os.ReadFile(filepath.Join("..", "..", "docs", "PERF.md"))
	if err != nil {
		t.Fatal(err)
	}
	if md != string(perf) {
		t.Error("the rendering of docs/results/*.json is not docs/PERF.md")
	}
	if _, stderr, code := cli(t, "report", doctor); code != exitUsage || !strings.Contains(stderr, "not a pinmem report") {
		t.Errorf("report doctor.json: exit %d, %s", code, stderr)
	}
}
