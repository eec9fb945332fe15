package load

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

// TestFakeMappedWindowsBounded loads through the mapping: every byte
// right, the windows registered read-only, and never more registered at
// once than the stages' memory.
func TestFakeMappedWindowsBounded(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 3<<20+777, 31)
	pinned0 := pinmem.Stats().Pinned.Bytes
	var mu sync.Mutex
	var peak int64
	sample := func() {
		mu.Lock()
		defer mu.Unlock()
		peak = max(peak, pinmem.Stats().Pinned.Bytes-pinned0)
	}
	l := e.loader(t, WithMode(ModeMapped), WithProgress(func(int64, int64) { sample() }))
	dst := e.devbuf(t, len(data))
	st, err := l.LoadFile(context.Background(), path, dst)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != ModeMapped || st.Fallback != "" || st.ReadBytes < int64(len(data)) {
		t.Errorf("stats %+v, want a mapped load", st)
	}
	if n := e.d.Calls("cuMemHostRegister_v2"); n < st.Reads {
		t.Errorf("%d registrations for %d reads", n, st.Reads)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
	if limit := 2 * l.PinnedBytes(); peak > limit || peak < l.PinnedBytes() {
		t.Errorf("pinned peak %d, want from the stages' %d to twice that", peak, l.PinnedBytes())
	}
}

// TestFakeMappedRefused: where the device cannot register read-only, or
// the driver refuses a registration, the load reads buffered, says why,
// and delivers every byte.
func TestFakeMappedRefused(t *testing.T) {
	path, data := tempFile(t, 1<<20+5, 32)
	for _, c := range []struct {
		name string
		opts fakedrv.Options
		fail bool
	}{
		{"no read-only support", fakedrv.Options{Devices: []fakedrv.DeviceSpec{{Attrs: map[cudadrv.DeviceAttribute]int{cudadrv.AttrReadOnlyHostRegisterSupported: 0}}}}, false},
		{"registration fails", fakedrv.Options{}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newFakeEnv(t, c.opts)
			if c.fail {
				if err := e.d.FailOn("cuMemHostRegister_v2", 0, cudadrv.ErrorNotSupported); err != nil {
					t.Fatal(err)
				}
			}
			l := e.loader(t, WithMode(ModeMapped))
			dst := e.devbuf(t, len(data))
			st, err := l.LoadFile(context.Background(), path, dst)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode != ModeBuffered || !strings.Contains(st.Fallback, "read-only registration") {
				t.Errorf("stats %+v, want a buffered load that says why", st)
			}
			testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
		})
	}
}
