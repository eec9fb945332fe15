package remote

import (
	"errors"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestAlloc: memory the transport allocates (Agent.Alloc) is pinned by
// pinmem (the ledger counts it), read and written by another agent over
// each transport, refuses a Free of its buffer, and is freed, unpinned and
// uncounted when its Region closes.
func TestAlloc(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			ctx := ctxT(t)
			const n = 1<<20 + 12345
			a := newAgent(t, tr.tls, tr.devices)
			b := newAgent(t, tr.tls, tr.devices)
			before := pinmem.Stats().Pinned.Bytes
			rb, err := b.Alloc(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			if got := pinmem.Stats().Pinned.Bytes - before; got < n {
				t.Fatalf("the ledger counts %d more bytes after Alloc(%d)", got, n)
			}
			if len(rb.Bytes()) != n || rb.Len() != n {
				t.Fatalf("Alloc(%d): %d bytes", n, len(rb.Bytes()))
			}
			copy(rb.Bytes(), testutil.RandomBytes(n, 3))
			buf, ok := pinmem.Lookup(rb.Bytes())
			if !ok {
				t.Fatal("Alloc's memory is not a pinmem buffer")
			}
			if err := buf.Free(); !errors.Is(err, ErrBusy) {
				t.Fatalf("Free of Alloc's buffer: %v, want ErrBusy", err)
			}
			local := alloc(t, n, 4)
			ra, err := a.Register(ctx, local.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			rem, err := a.Import(ctx, rb.Key())
			if err != nil {
				t.Fatal(err)
			}
			if err := rem.Get(ctx, ra, []Block{{Len: n}}); err != nil {
				t.Fatal(err)
			}
			testutil.CheckBytes(t, testutil.RandomBytes(n, 3), local.Bytes())
			copy(local.Bytes(), testutil.RandomBytes(n, 5))
			if err := rem.Put(ctx, ra, []Block{{Local: 7, Remote: 9, Len: n - 9}}); err != nil {
				t.Fatal(err)
			}
			testutil.CheckBytes(t, local.Bytes()[7:n-2], rb.Bytes()[9:])
			for _, c := range []interface{ Close() error }{rem, ra, rb} {
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if got := pinmem.Stats().Pinned.Bytes - before; got != pinned(local) {
				t.Fatalf("after Close the ledger counts %d more bytes than before Alloc, want the local buffer's %d", got, pinned(local))
			}
			if s := b.Stats(); s.Registrations != 0 {
				t.Fatalf("agent b holds %+v", s)
			}
		})
	}
}

func pinned(b *pinmem.Buffer) int64 { return b.Pinned() }
