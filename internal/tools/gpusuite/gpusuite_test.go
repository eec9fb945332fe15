//go:build unix

package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func parseFile(t *testing.T, name string) (result, string) {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var echo bytes.Buffer
	res, err := parseEvents(f, &echo)
	if err != nil {
		t.Fatal(err)
	}
	return res, echo.String()
}

// TestParseSample: testdata/sample.jsonl is `go tool test2json` of the
// sample package's binary run with -test.v=test2json (see sample_test.go).
func TestParseSample(t *testing.T) {
	res, echo := parseFile(t, "sample.jsonl")
	// Passes: TestPass, TestSub/a, TestFeatureSkips, TestHang. Failures:
	// TestFail, TestSub/c, TestSub. Skips: three tests and TestSub/b.
	if res.Pass != 4 || res.Fail != 3 || res.Skip != 4 || res.Package != "fail" {
		t.Errorf("counts %d/%d/%d, package %q; want 4 passed, 3 failed, 4 skipped, fail", res.Pass, res.Fail, res.Skip, res.Package)
	}
	wantSkips := []string{
		"TestSkipWithReason: no GPU: PINMEM_REQUIRE_GPU is unset",
		"TestSkipLate: skipped at the end",
		"TestSkipNoReason: (no reason printed)",
		"TestSub/b: b needs two devices",
	}
	if !slices.Equal(res.Skips, wantSkips) {
		t.Errorf("skips\n %q\nwant\n %q", res.Skips, wantSkips)
	}
	wantFails := []string{"TestFail: got 1, want 2", "TestSub/c: c broke", "TestSub"}
	if !slices.Equal(res.Failures, wantFails) {
		t.Errorf("failures %q, want %q", res.Failures, wantFails)
	}
	if !slices.Equal(res.Features, []string{"managed memory (device attribute 0)"}) {
		t.Errorf("features %q", res.Features)
	}
	for _, want := range []string{"=== RUN   TestPass\n", "--- FAIL: TestFail (", "    sample_test.go:", "FAIL\n"} {
		if !strings.Contains(echo, want) || !strings.Contains(res.Text, want) {
			t.Errorf("echoed output lacks %q", want)
		}
	}
	if echo != res.Text {
		t.Error("the echo and the kept text differ")
	}
}

// TestParseRealBinary: testdata/bench.jsonl is internal/tools/bench's test
// binary on a machine without a GPU, through test2json.
func TestParseRealBinary(t *testing.T) {
	res, _ := parseFile(t, "bench.jsonl")
	if res.Pass != 7 || res.Fail != 0 || res.Skip != 5 || res.Package != "pass" {
		t.Errorf("counts %d/%d/%d, package %q; want 7/0/5, pass", res.Pass, res.Fail, res.Skip, res.Package)
	}
	for _, s := range res.Skips {
		if !strings.HasPrefix(s, "TestGPU") || !strings.Contains(s, ": no GPU: ") {
			t.Errorf("skip %q: want a GPU test with its reason", s)
		}
	}
}

// TestParseNotJSON: lines that are not events (a crash before the binary
// printed anything, a sanitizer's banner) are kept as output, and a
// missing final event leaves Package empty.
func TestParseNotJSON(t *testing.T) {
	in := "========= COMPUTE-SANITIZER\n" +
		`{"Action":"run","Test":"TestX"}` + "\n" +
		`{"Action":"output","Test":"TestX","Output":"    x_test.go:3: boom\n"}` + "\n" +
		"========= ERROR SUMMARY: 2 errors\n"
	res, err := parseEvents(strings.NewReader(in), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Package != "" || res.Pass+res.Fail+res.Skip != 0 || !strings.Contains(res.Text, "ERROR SUMMARY: 2 errors\n") {
		t.Errorf("result %+v", res)
	}
}

// TestAccount: the summary rows and failures for the outcomes the runner
// classifies.
func TestAccount(t *testing.T) {
	var out bytes.Buffer
	s := &suite{tier: "sanitize", out: t.TempDir(), w: &out, start: time.Now()}
	s.account("ok.test", 0, result{Pass: 3, Skip: 1, Package: "pass", Skips: []string{"TestY: no"}}, "1s", 60)
	s.account("nocuda.test", 1, result{Pass: 2, Package: "pass", Text: "PASS\n========= Target application terminated before first instrumented API call\n"}, "1s", 60)
	s.account("timeout.test", 2, result{Pass: 1, Text: "panic: test timed out after 60s\n"}, "61s", 60)
	s.account("memcheck.test", 99, result{Pass: 5, Package: "pass", Text: "========= ERROR SUMMARY: 3 errors\n"}, "9s", 60)
	s.account("leak.test", 1, result{Pass: 5, Package: "pass", Text: "PASS\nFAIL: leaked 2 streams\n"}, "1s", 60)
	s.account("hung.test", 124, result{}, "80s", 60)
	if s.totPass != 16 || s.totFail != 4 || s.totSkp != 1 {
		t.Errorf("totals %d/%d/%d, want 16/4/1", s.totPass, s.totFail, s.totSkp)
	}
	want := []string{
		"timeout.test: test timed out after 60s",
		"memcheck.test: ERROR SUMMARY: 3 errors",
		"memcheck.test: compute-sanitizer reported errors",
		"leak.test: FAIL: leaked 2 streams",
		"hung.test: killed after 60s+ (hung?)",
	}
	if !slices.Equal(s.fails, want) {
		t.Errorf("failures\n %q\nwant\n %q", s.fails, want)
	}
	if !strings.Contains(s.rows[1], "PASS") || !strings.Contains(s.rows[1], "(no CUDA calls)") {
		t.Errorf("row %q: a CPU-only package under the sanitizer passes", s.rows[1])
	}
	if s.summary() != 1 {
		t.Error("summary with failures exits 0")
	}
	for _, want := range []string{"BINARY ", "ok.test                            PASS        3      0      1       1s\n",
		"Skipped:\n  ok.test: TestY: no\n", "Failures:\n  timeout.test: test timed out", "\n16 passed, 4 failed, 1 skipped\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

// TestRunTestLive builds the sample package and test2json, runs the sample
// through runTest (the pipe, the events, the exit status), then again with
// a hang that the limit must kill.
func TestRunTestLive(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	dir := t.TempDir()
	for _, b := range [][]string{
		{"test", "-c", "-o", filepath.Join(dir, "sample.test"), "./testdata/sample"},
		{"build", "-o", filepath.Join(dir, "test2json"), "cmd/test2json"},
	} {
		if out, err := exec.Command(gobin, b...).CombinedOutput(); err != nil {
			t.Fatalf("go %v: %v\n%s", b, err, out)
		}
	}
	var echo bytes.Buffer
	rc, res, err := runTest([]string{filepath.Join(dir, "sample.test"), "-test.v=test2json"}, "testdata/sample",
		filepath.Join(dir, "test2json"), "sample.test", time.Minute, &echo)
	if err != nil || rc != 1 || res.Pass != 4 || res.Fail != 3 || res.Skip != 4 || res.Package != "fail" {
		t.Fatalf("runTest: rc %d, %+v, %v\n%s", rc, res, err, echo.String())
	}
	t.Setenv("SAMPLE_HANG", "1")
	start := time.Now()
	rc, res, err = runTest([]string{filepath.Join(dir, "sample.test"), "-test.v=test2json", "-test.run=TestHang"}, "testdata/sample",
		filepath.Join(dir, "test2json"), "sample.test", 500*time.Millisecond, &echo)
	if err != nil || rc != 124 || res.Package != "" || time.Since(start) > 15*time.Second {
		t.Fatalf("hung test: rc %d after %v, %+v, %v", rc, time.Since(start), res, err)
	}
}
