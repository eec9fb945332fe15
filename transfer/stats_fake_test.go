package transfer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/transfer"
)

// TestStatsStringOnFake: on cudatest's fake, which has no timing model, a
// transfer's Stats say "no timing on the fake" instead of GB/s; without a
// fake they give the rate.
func TestStatsStringOnFake(t *testing.T) {
	real := transfer.Stats{Direction: transfer.HostToDevice, Bytes: 2e9, Wall: time.Second}
	if s := real.String(); !strings.Contains(s, "2.00 GB/s") {
		t.Errorf("without a fake: %q", s)
	}
	cudatest.Install(t)
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	c, err := transfer.New(gpu)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	d, err := gpu.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free()
	st, err := c.HtoD(context.Background(), d, make([]byte, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	if s := st.String(); !strings.Contains(s, "no timing on the fake") || strings.Contains(s, "GB/s") {
		t.Errorf("on the fake: %q", s)
	}
}
