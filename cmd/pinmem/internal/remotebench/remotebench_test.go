package remotebench

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/pinmem/pinmem/remote"
)

const envServe = "PINMEM_REMOTEBENCH_TEST_SERVE"

func TestMain(m *testing.M) {
	if n := os.Getenv(envServe); n != "" {
		v, _ := strconv.Atoi(n)
		if err := ServePeer(v); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRun: a small run over TCP and shared memory gives put, put-same,
// put-alloc and put-alloc-same rows per size and list, and a registration row; ucx_perftest
// rows come with ratios where the tool is installed.
func TestRun(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	peer := func(n int64) *exec.Cmd {
		c := exec.Command(exe)
		c.Env = append(os.Environ(), envServe+"="+strconv.FormatInt(n, 10))
		return c
	}
	cfg := Config{Transports: Transports[:2], Sizes: []int64{4096, 1 << 20}, Lists: []int{1, 8}, MaxBytes: 4 << 20, Samples: 1, RegBytes: 8 << 20}
	if p, err := exec.LookPath("ucx_perftest"); err == nil {
		cfg.Perftest = p
	}
	rows, note, err := Run(context.Background(), cfg, peer, func(string) {})
	if errors.Is(err, remote.ErrUnavailable) && os.Getenv("PINMEM_REQUIRE_UCX") != "1" {
		t.Skipf("UCX unavailable: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, r := range rows {
		count[r.What]++
		if r.What != "register" && r.GBps <= 0 {
			t.Errorf("row %+v has no figure", r)
		}
		if r.What == "put" && cfg.Perftest != "" && r.Ratio <= 0 {
			t.Errorf("row %+v has no ratio", r)
		}
	}
	if count["put"] != 8 || count["put-same"] != 8 || count["put-alloc"] != 8 || count["put-alloc-same"] != 8 || count["register"] != 2 {
		t.Fatalf("rows %v", count)
	}
	t.Logf("memory: %q; %d rows", note, len(rows))
}

func TestParsePerftest(t *testing.T) {
	out := []byte("+----+\nFinal:                   200     87.108   378.605   378.605    10565.10   10565.10        2641        2641\n")
	gb, ok := parsePerftest(out)
	if !ok || gb < 11.07 || gb > 11.08 {
		t.Fatalf("%v %v, want 10565.10 MiB/s = 11.078 GB/s", gb, ok)
	}
	if _, ok := parsePerftest([]byte("Final: x")); ok {
		t.Fatal("parsed a line with no figure")
	}
}
