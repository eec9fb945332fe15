package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/bench"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

func TestBenchMatrixFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "matrix", "--devices", "0,x"}, `--devices: device "x"`},
		{[]string{"bench", "matrix", "--size", "big"}, "--size"},
		{[]string{"bench", "matrix", "--dir", "up"}, "--dir"},
		{[]string{"bench", "matrix", "--samples", "0"}, "--samples 0"},
		{[]string{"bench", "matrix", "--format", "xml"}, "--format"},
	} {
		if _, _, line := execute(t, c.args...); !strings.Contains(line, c.want) {
			t.Errorf("%v: %q, want %q", c.args, line, c.want)
		}
	}
	if d, err := parseDevices("1, 0,1"); err != nil || len(d) != 2 || d[0] != 1 {
		t.Errorf("parseDevices: %v %v", d, err)
	}
}

// TestBenchMatrixFake runs the command on a fake driver with two devices
// (structure only: the fake's figures mean nothing).
func TestBenchMatrixFake(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{DeviceCount: 2})
	out, _, line := execute(t, "bench", "matrix", "--size", "64KiB", "--samples", "1", "--quiet", "--format", "json")
	if line != "" {
		t.Fatal(line)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2*3+3 || rep.Results[8].Kind != bench.KindAll {
		t.Fatalf("%d results: %+v", len(rep.Results), rep.Results)
	}
	out, _, line = execute(t, "bench", "matrix", "--size", "64KiB", "--samples", "1", "--quiet", "--devices", "1", "--dir", "h2d")
	if line != "" || !strings.Contains(out, "gpu1") || strings.Contains(out, "gpu0") || !strings.Contains(out, "all at once") {
		t.Fatalf("table (%s):\n%s", line, out)
	}
}
