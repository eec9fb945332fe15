package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(envCgroupChild); dir != "" {
		os.Exit(cgroupChild(dir, os.Stdout)) // case 4's child, started by TestOnGPU
	}
	extest.Main(m, main)
}

func TestFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil || cfg.cgroup || cfg.cgroupLimit != 64<<20 {
		t.Errorf("defaults = %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{{"-cgroup-limit", "1KiB"}, {"-cgroup-limit", "x"}, {"x"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestRunOnFakeDriver runs the cases on the fake driver (16 GiB of device
// memory by default): each fails the way it should, and the budget in force
// before comes back.
func TestRunOnFakeDriver(t *testing.T) {
	cudatest.Install(t)
	before := pinmem.Budget()
	var out strings.Builder
	res, err := run(context.Background(), config{cgroupLimit: 64 << 20}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 {
		t.Fatalf("%d outcomes, want 3", len(res))
	}
	var be *pinmem.BudgetError
	if !res[0].Ran || !errors.As(res[0].Err, &be) {
		t.Errorf("budget case: %+v", res[0])
	}
	if !res[1].Ran || !errors.Is(res[1].Err, cuda.ErrOutOfMemory) {
		t.Errorf("device case: %+v", res[1])
	}
	var oom *pinmem.OutOfMemoryError
	if res[2].Ran && (!errors.As(res[2].Err, &oom) || oom.Op != "mmap") {
		t.Errorf("host case: %+v", res[2])
	}
	if got := pinmem.Budget(); got != before {
		t.Errorf("budget after the run %d, want %d", got, before)
	}
	if !strings.Contains(out.String(), "article:  pinned allocations can fail; always check the result") {
		t.Errorf("output:\n%s", out.String())
	}
}

// TestNoFailureIsAnError checks that a case that does not fail is an error
// of the program: the fake device reports 1 MiB of memory but lets 1 GiB be
// allocated, so the request for twice its memory succeeds.
func TestNoFailureIsAnError(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{{TotalMem: 1 << 20}}, DeviceMemLimit: 1 << 30})
	_, err := run(context.Background(), config{cgroupLimit: 64 << 20}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "case device: a device allocation of 2097152 bytes succeeded") {
		t.Fatalf("run = %v", err)
	}
}

func TestSummary(t *testing.T) {
	got := summary([]Outcome{
		{Case: "budget", Ran: true, Err: &pinmem.BudgetError{}},
		{Case: "host", Why: "no"},
		{Case: "cgroup", Ran: true, Note: "granted"},
	})
	want := "budget: *pinmem.BudgetError (pinmem.ErrBudget); host: not run (no); cgroup: granted"
	if got != want {
		t.Errorf("summary = %q, want %q", got, want)
	}
}

func TestWithoutGPU(t *testing.T) {
	extest.CheckNoGPU(t, "allocfail")
}

var full = flag.Bool("full", false, "TestOnGPU: also run case 4 (a child pinning beyond a new cgroup's limit, where one can be made)")

// TestOnGPU runs cases 1 to 3 on the GPU, and with -full case 4 (it reports
// "not run" where no cgroup can be made).
func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	res, err := run(context.Background(), config{cgroup: *full, cgroupLimit: 64 << 20}, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 + map[bool]int{true: 1}[*full]; len(res) != want || !res[0].Ran || !res[1].Ran {
		t.Errorf("outcomes %+v", res)
	}
}

// TestCgroupCase runs case 4 where this machine lets a cgroup be created
// (the child, this test binary, pins through whatever driver it finds, or
// says it found none) and checks that the cgroup is gone afterwards.
func TestCgroupCase(t *testing.T) {
	var out strings.Builder
	o, err := cgroupCase(context.Background(), &out, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Ran {
		if o.Why == "" {
			t.Fatal("case 4 neither ran nor said why")
		}
		t.Skip("no cgroup here: " + o.Why)
	}
	if o.Note == "" {
		t.Errorf("case 4 ran and noted nothing:\n%s", out.String())
	}
	var left []string
	for _, pat := range []string{"", "*/", "*/*/", "*/*/*/"} {
		m, _ := filepath.Glob(filepath.Join(cgroup2Mount(), pat+fmt.Sprintf("pinmem-allocfail-%d", os.Getpid())))
		left = append(left, m...)
	}
	if len(left) > 0 {
		t.Errorf("the cgroup is still there: %v", left)
	}
	t.Log(o.Note)
}
