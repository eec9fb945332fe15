package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestStagedIsCopier: the kind staged of old result files (testdata holds
// the results shipped at f7fe20b, before copier existed) and of old
// command lines is read as copier, so that compare pairs an old run's
// Copier rows with a new run's, and --kinds staged measures the Copier
// with a line saying the name is deprecated.
func TestStagedIsCopier(t *testing.T) {
	old := filepath.Join("testdata", "staged-f7fe20b.json")
	rep := readReport(t, old)
	n := 0
	for _, r := range rep.Results {
		if r.Kind == bench.KindStaged {
			t.Fatalf("row %s %s %s read as kind staged", r.Bench, r.Kind, r.Dir)
		}
		if r.Kind == bench.KindCopier && strings.Contains(r.Note, "recorded as kind staged") {
			n++
		}
	}
	if n == 0 {
		t.Fatal("testdata/staged-f7fe20b.json: no staged row read as copier")
	}

	testutil.UseFake(t, fakedrv.Options{})
	out := filepath.Join(t.TempDir(), "new.json")
	_, stderr, code := cli(t, "bench", "--kinds", "staged,pinned", "--sizes", "256MiB", "--dirs", "h2d", "--samples", "1", "--quiet", "-o", out)
	if code != exitOK || !strings.Contains(stderr, "--kinds staged is the deprecated name of copier") {
		t.Fatalf("bench --kinds staged: exit %d, %q", code, stderr)
	}
	// The old run and the new one pair up on copier (across devices: the
	// new one is the fake's).
	stdout, stderr, code := cli(t, "compare", old, out, "--across-devices")
	if code != exitOK || !strings.Contains(stdout, "copier") {
		t.Errorf("compare of a staged run with a copier run: exit %d, %s\n%s", code, stderr, stdout)
	}
}
