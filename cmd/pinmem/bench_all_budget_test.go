package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestBenchAllBudget: --budget is checked before any GPU work; a run
// under a budget gives each test its share (said on its progress line and
// recorded in its report), keeps every row, and its last line says the
// time against the budget.
func TestBenchAllBudget(t *testing.T) {
	for _, b := range []string{"-1s", "5s", "soon"} {
		if _, stderr, code := cli(t, "bench", "all", "--budget", b, "--out", t.TempDir()); code != exitUsage {
			t.Errorf("--budget %s: exit %d, %q; want %d", b, code, stderr, exitUsage)
		}
	}
	testutil.UseFake(t, fakedrv.Options{})
	dir := filepath.Join(t.TempDir(), "out")
	_, stderr, code := cli(t, "bench", "all", "--quick", "--budget", "20s", "-t", "bw,blocks", "--out", dir)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	// bw weighs 3 and blocks 2 of the 5 selected: 12s of the 20s (less
	// the time the run took to start), and blocks what is left.
	m := regexp.MustCompile(`\] bw: .* \(budget (\d+)s\)`).FindStringSubmatch(stderr)
	if m == nil || (m[1] != "12" && m[1] != "11") || !strings.Contains(stderr, "] blocks: ") || !strings.Contains(stderr, "of a budget of 20s") {
		t.Errorf("the progress lines do not give the shares and the budget:\n%s", stderr)
	}
	for _, name := range []string{"bw", "blocks"} {
		rep := readReport(t, filepath.Join(dir, name+".json"))
		cfg, _ := rep.Meta.Config.(map[string]any)
		suite, _ := cfg["suite"].(map[string]any)
		if b, _ := suite["budget_ns"].(float64); b < 1e9 {
			t.Errorf("%s: config.suite.budget_ns %v, want its share", name, suite["budget_ns"])
		}
		if len(rep.Results) == 0 {
			t.Errorf("%s: no rows", name)
		}
	}
	// Without a budget, no share is given.
	_, stderr, code = cli(t, "bench", "all", "--quick", "--budget", "0", "-t", "zerocopy", "--out", dir)
	if code != exitOK || strings.Contains(stderr, "budget") {
		t.Errorf("--budget 0: exit %d, %s", code, stderr)
	}
}
