package transfer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// allCalls lists every driver symbol called between two CallCounts,
// queries and context switches included, with how often.
func allCalls(before, after map[string]int) string {
	var out []string
	for op, n := range after {
		if k := n - before[op]; k > 0 && strings.HasPrefix(op, "cu") {
			out = append(out, fmt.Sprintf("%s=%d", strings.TrimPrefix(op, "cu"), k))
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// TestSmallCopyCalls counts every driver call of one warm 4 KiB and
// 64 KiB transfer each way: the Copier with a context that cannot end and
// with one that can (as pinmem bench's, a service's request), and the
// driver's own synchronous copy of the same slice (DeviceBuffer.WriteAt
// and ReadAt), which pinmem bench compares them with: no call beyond the
// copy and its wait (one synchronisation, or the poll's queries with a
// context that can end), where the driver's copy is one call between two
// context switches.
func TestSmallCopyCalls(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	cctx := testutil.PrimaryContext(t)
	c, err := New(cctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	can, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, n := range []int{4 << 10, 64 << 10} {
		dev, err := cctx.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		h := testutil.RandomBytes(n, uint64(n))
		back := make([]byte, n)
		for _, v := range []struct {
			name   string
			htod   func() error
			dtoh   func() error
			hw, dw string
		}{
			{"copier", func() error { _, err := c.HtoD(context.Background(), dev, h); return err },
				func() error { _, err := c.DtoH(context.Background(), back, dev); return err },
				"MemcpyHtoDAsync_v2=1 StreamSynchronize=1", "MemcpyDtoHAsync_v2=1 StreamSynchronize=1"},
			{"copier-ctx", func() error { _, err := c.HtoD(can, dev, h); return err },
				func() error { _, err := c.DtoH(can, back, dev); return err },
				"MemcpyHtoDAsync_v2=1 StreamQuery=", "MemcpyDtoHAsync_v2=1 StreamQuery="},
			{"driver", func() error { _, err := dev.WriteAt(h, 0); return err },
				func() error { _, err := dev.ReadAt(back, 0); return err },
				"", ""},
		} {
			for _, op := range []struct {
				dir  string
				f    func() error
				want string
			}{{"H2D", v.htod, v.hw}, {"D2H", v.dtoh, v.dw}} {
				if err := op.f(); err != nil { // warm
					t.Fatal(err)
				}
				clear(back)
				before := d.CallCounts()
				if err := op.f(); err != nil {
					t.Fatal(err)
				}
				got := allCalls(before, d.CallCounts())
				t.Logf("%-10s %s %6d: %s", v.name, op.dir, n, got)
				// Exactly the copy and the wait: the copy and one
				// synchronisation, or (a context that can end) the copy
				// and the queries of the poll, however many it took.
				if op.want != "" && (!strings.HasPrefix(got, op.want) || strings.Count(got, "=") != 2) {
					t.Errorf("%s %s %d: calls %s, want %s", v.name, op.dir, n, got, op.want)
				}
				if op.dir == "D2H" {
					testutil.CheckBytes(t, h, back)
				}
			}
		}
		if err := dev.Free(); err != nil {
			t.Fatal(err)
		}
	}
}
