package transfer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestDriverCallsPerTransfer counts the driver calls one pageable
// transfer of a Copier makes at each size, both ways, on a warm Copier
// with a context that cannot end: the GPU-visible schedule (copies, event
// records, stream waits, synchronisations) per size. Queries of events
// and streams depend on timing and are left out. The table is the
// schedule the per-size bands of route.go give; a change to it is a
// change of the hot path and must be deliberate.
func TestDriverCallsPerTransfer(t *testing.T) {
	if testing.Short() {
		t.Skip("copies 2 x 256 MiB through the fake")
	}
	want := map[string]string{
		"H2D 4KiB":   "MemcpyHtoDAsync_v2=1 StreamSynchronize=1",
		"D2H 4KiB":   "MemcpyDtoHAsync_v2=1 StreamSynchronize=1",
		"H2D 64KiB":  "MemcpyHtoDAsync_v2=1 StreamSynchronize=1",
		"D2H 64KiB":  "MemcpyDtoHAsync_v2=1 StreamSynchronize=1",
		"H2D 1MiB":   "MemcpyHtoDAsync_v2=4 StreamSynchronize=1",
		"D2H 1MiB":   "MemcpyDtoHAsync_v2=1 StreamSynchronize=1",
		"H2D 4MiB":   "MemcpyHtoDAsync_v2=1 StreamSynchronize=1",
		"D2H 4MiB":   "MemcpyDtoHAsync_v2=1 StreamSynchronize=1",
		"H2D 16MiB":  "MemcpyHtoDAsync_v2=2 StreamSynchronize=1",
		"D2H 16MiB":  "EventRecord=1 MemcpyDtoHAsync_v2=2 StreamSynchronize=1",
		"H2D 64MiB":  "EventRecord=6 MemcpyHtoDAsync_v2=4 StreamSynchronize=1",
		"D2H 64MiB":  "EventRecord=6 MemcpyDtoHAsync_v2=4 StreamSynchronize=1",
		"H2D 256MiB": "EventRecord=10 MemcpyHtoDAsync_v2=8 StreamSynchronize=1",
		"D2H 256MiB": "EventRecord=10 MemcpyDtoHAsync_v2=8 StreamSynchronize=1",
	}
	t.Run("plain", func(t *testing.T) { driverCalls(t, context.Background(), want) })
	// With statistics and a context that can end: the timing events and
	// the polled waits (logged only).
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	t.Run("stats+deadline", func(t *testing.T) { driverCalls(t, ctx, nil, WithStats(true)) })
}

func driverCalls(t *testing.T, ctx context.Context, want map[string]string, opts ...Option) {
	d := testutil.UseFake(t, fakedrv.Options{})
	cctx := testutil.PrimaryContext(t)
	c, err := New(cctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	for _, n := range []int{4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20} {
		dev, err := cctx.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		h := make([]byte, n)
		for _, dir := range []Direction{HostToDevice, DeviceToHost} {
			one := func() {
				var err error
				if dir == HostToDevice {
					_, err = c.HtoD(ctx, dev, h)
				} else {
					_, err = c.DtoH(ctx, h, dev)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			one() // warm: stages grown, goroutines started
			before := d.CallCounts()
			one()
			got := callDiff(before, d.CallCounts())
			name := fmt.Sprintf("%s %s", map[Direction]string{HostToDevice: "H2D", DeviceToHost: "D2H"}[dir], callSizeName(n))
			t.Logf("%-11s %s", name, got)
			if w := want[name]; w != "" && got != w {
				t.Errorf("%s: driver calls %s, want %s", name, got, w)
			}
		}
		if err := dev.Free(); err != nil {
			t.Fatal(err)
		}
	}
}

// callDiff lists the driver symbols called between two CallCounts, with
// how often, queries left out.
func callDiff(before, after map[string]int) string {
	var out []string
	for op, n := range after {
		if !strings.HasPrefix(op, "cu") || strings.Contains(op, "Query") || strings.Contains(op, "CtxGetCurrent") || strings.Contains(op, "CtxSetCurrent") {
			continue
		}
		if k := n - before[op]; k > 0 {
			out = append(out, fmt.Sprintf("%s=%d", strings.TrimPrefix(op, "cu"), k))
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func callSizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// TestDriverCallsPerBroadcast counts the driver calls of one staged
// Broadcast to two devices (queries left out): per chunk and device one
// copy out of the shared stage and one event, per device one end event
// and one synchronisation.
func TestDriverCallsPerBroadcast(t *testing.T) {
	want := map[int]string{
		64 << 10: "EventRecord=4 MemcpyHtoDAsync_v2=2 StreamSynchronize=2",
		4 << 20:  "EventRecord=10 MemcpyHtoDAsync_v2=8 StreamSynchronize=2",
		64 << 20: "EventRecord=10 MemcpyHtoDAsync_v2=8 StreamSynchronize=2",
	}
	for _, n := range []int{64 << 10, 4 << 20, 64 << 20} {
		t.Run(callSizeName(n), func(t *testing.T) {
			e := useMultiFake(t, 2, n)
			m, err := NewMulti(e.ctxs)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close(context.Background()) })
			src := make([]byte, n)
			for i := range 2 { // the first warms up: it pins the stages
				before := e.d.CallCounts()
				if _, err := m.Broadcast(context.Background(), e.bufs, src); err != nil {
					t.Fatal(err)
				}
				if got := callDiff(before, e.d.CallCounts()); i > 0 && got != want[n] {
					t.Errorf("driver calls %s, want %s", got, want[n])
				}
			}
		})
	}
}

// TestDriverCallsPerPipeline counts the driver calls of one warm Pipeline
// Run (queries left out) for each kind of input and output: per chunk a
// copy in, the work, a copy out and the chunk's event; per stream one
// synchronisation that collects its asynchronous errors (11 chunks on 3
// streams).
func TestDriverCallsPerPipeline(t *testing.T) {
	const chunk = 64 << 10
	n := 10*chunk + 777
	want := map[string]string{
		"go":               "EventRecord=11 LaunchKernel=11 MemcpyDtoHAsync_v2=11 MemcpyHtoDAsync_v2=11 StreamSynchronize=3",
		"pinned":           "EventRecord=11 LaunchKernel=11 MemcpyDtoHAsync_v2=11 MemcpyHtoDAsync_v2=11 StreamSynchronize=3",
		"nooutput":         "EventRecord=11 LaunchKernel=11 MemcpyHtoDAsync_v2=11 StreamSynchronize=3",
		"pinned-in-go-out": "EventRecord=11 LaunchKernel=11 MemcpyDtoHAsync_v2=11 MemcpyHtoDAsync_v2=11 StreamSynchronize=3",
	}
	for _, mode := range []string{"go", "pinned", "nooutput", "pinned-in-go-out"} {
		for _, ordered := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/ordered=%v", mode, ordered), func(t *testing.T) {
				e := useFake(t, fakedrv.Options{})
				c := e.copier(t, smallRing()...)
				f := e.addKernel(t)
				p := e.pipeline(t, c, pipelineCfg{ChunkSize: chunk, Streams: 3, InFlight: 4, Ordered: ordered, Work: addWork(f, 1)})
				in, out := make([]byte, n), make([]byte, n)
				switch mode {
				case "pinned", "pinned-in-go-out":
					bin, err := pinmem.Alloc(n, 0)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = bin.Free() })
					in = bin.Bytes()
					if mode == "pinned" {
						bout, err := pinmem.Alloc(n, 0)
						if err != nil {
							t.Fatal(err)
						}
						t.Cleanup(func() { _ = bout.Free() })
						out = bout.Bytes()
					}
				case "nooutput":
					out = nil
				}
				for i := range 2 { // the first warms up: it pins the stages
					before := e.d.CallCounts()
					if _, err := p.Run(context.Background(), in, out); err != nil {
						t.Fatal(err)
					}
					if got := callDiff(before, e.d.CallCounts()); i == 1 && got != want[mode] {
						t.Errorf("driver calls %s, want %s", got, want[mode])
					}
				}
			})
		}
	}
}
