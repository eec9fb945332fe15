package remote

import (
	"context"
	"fmt"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/freehook"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/pagenode"
	"github.com/pinmem/pinmem/remote/internal/ucx"
)

// slab is one pinmem buffer registered with the agent's context, in
// pieces of at most the agent's registration limit. Its fields other than
// refs are set before it is published; refs, busy and dead change on the
// agent's thread under a.mu.
type slab struct {
	id     uint64
	buf    *pinmem.Buffer
	base   uintptr
	n      uintptr
	pieces []piece
	refs   int  // open Regions
	busy   int  // transfers in flight that use it
	dead   bool // unmapped
	unhook func()
	owned  bool // allocated by UCX (Agent.Alloc): freed with the registration
}

// piece is one registration: [off, off+n) of the slab.
type piece struct {
	off, n uintptr
	memh   ucx.Memh
	rkey   []byte // packed
	node   int    // NUMA node, -1 unknown or mixed
}

// Registration describes one registration of a region: a range of it
// (offsets from the region's start) and the NUMA node that holds its pages.
type Registration struct {
	Offset, Len int64
	NUMANode    int // -1: unknown, or pages on several nodes
}

// Region is local pinned memory registered with an agent: the source of a
// Put, the destination of a Get, and what a remote key exposes to other
// agents. Regions of one pinmem buffer share one registration of the
// whole buffer (registered once, at the first Register, and dropped when
// the last of its Regions is closed, the agent closes, or the buffer is
// freed).
type Region struct {
	a      *Agent
	s      *slab
	off, n uintptr
	closed bool // under a.mu
}

// Register registers p, which must lie inside one pinmem buffer (from
// pinmem.Alloc or pinmem.Register), for transfers. The whole buffer is
// registered the first time (in pieces of at most the agent's limit, each
// with its NUMA node); later Registers of any range of it reuse that
// registration. Freeing the buffer drops the registration first, and is
// refused with ErrBusy while a transfer uses it.
func (a *Agent) Register(ctx context.Context, p []byte) (*Region, error) {
	const op = "remote.Agent.Register"
	if !a.ok() {
		return nil, errNil(op, "Agent")
	}
	if len(p) == 0 {
		return nil, &Error{Op: op, Kind: cuda.ErrInvalidValue, Detail: "empty range"}
	}
	b, ok := pinmem.Lookup(p)
	if !ok {
		return nil, &Error{Op: op, Kind: cuda.ErrInvalidValue, Detail: fmt.Sprintf("%#x (%d bytes) is not pinmem memory", hostptr.AddrOf(p), len(p))}
	}
	all := b.Bytes()
	base, lo := hostptr.AddrOf(all), hostptr.AddrOf(p)
	if lo < base || lo+uintptr(len(p)) > base+uintptr(len(all)) {
		return nil, &Error{Op: op, Kind: ErrOutOfRange, Detail: fmt.Sprintf("%#x (%d bytes) runs past the end of %v", lo, len(p), b)}
	}
	var r *Region
	err := a.do(ctx, op, func() error {
		a.mu.Lock()
		s := a.slabs[base]
		if s != nil && s.buf == b && !s.dead {
			s.refs++
			a.mu.Unlock()
			r = &Region{a: a, s: s, off: lo - base, n: uintptr(len(p))}
			return nil
		}
		a.nextID++
		id := a.nextID
		a.mu.Unlock()
		s, err := a.mapSlab(b, base, uintptr(len(all)))
		if err != nil {
			return &Error{Op: op, Kind: ErrUnavailable, Detail: fmt.Sprintf("registering %v", b), Err: err}
		}
		s.id, s.refs = id, 1
		s.unhook = freehook.Add(base, func() error { return a.dropSlab(s) })
		a.mu.Lock()
		a.slabs[base] = s
		a.mu.Unlock()
		r = &Region{a: a, s: s, off: lo - base, n: uintptr(len(p))}
		return nil
	})
	return r, err
}

// mapSlab registers [base, base+n) in pieces (agent's thread).
func (a *Agent) mapSlab(b *pinmem.Buffer, base, n uintptr) (*slab, error) {
	s := &slab{buf: b, base: base, n: n}
	for off := uintptr(0); off < n; off += uintptr(a.maxReg) {
		pn := min(n-off, uintptr(a.maxReg))
		m, err := a.lib.MemMap(a.uctx, base+off, pn)
		if err != nil {
			s.unmap(a)
			return nil, err
		}
		s.pieces = append(s.pieces, piece{off: off, n: pn, memh: m, node: pagenode.Of(base+off, base+off+pn/2, base+off+pn-1)})
		rk, err := a.lib.RkeyPack(a.uctx, m)
		if err != nil {
			s.unmap(a)
			return nil, err
		}
		s.pieces[len(s.pieces)-1].rkey = rk
	}
	return s, nil
}

// unmap drops the slab's registrations (agent's thread, under a.mu once
// the slab is published). A slab of
// Agent.Alloc is unpinned first and its memory freed with the
// registration; if pinmem cannot unpin it, the memory is kept (the driver
// still pins it) and so is the UCX allocation.
func (s *slab) unmap(a *Agent) {
	if s.unhook != nil {
		s.unhook() // first: the owned buffer's own Free must not meet it
		s.unhook = nil
	}
	keep := false
	if s.owned {
		keep = s.buf.Free() != nil
	}
	for _, p := range s.pieces {
		if !keep {
			_ = a.lib.MemUnmap(a.uctx, p.memh)
		}
	}
	s.pieces = nil
	s.dead = true
}

// Alloc has the agent's transport allocate n bytes (at most the agent's
// registration limit), pins them with pinmem.Register (counted by the
// ledger and the budget) and returns them registered, as a Region whose
// Bytes are the memory. With a shared-memory transport UCX allocates a
// segment that other processes on the host map, so their puts and gets
// are plain copies into and out of it (as ucx_perftest's are): expose
// memory to other processes from Alloc where it matters; a Region of
// pinmem memory goes through UCX's emulation of remote access over shared
// memory instead. Closing the Region (or the agent) frees the memory; a
// Free of its pinmem buffer is refused.
func (a *Agent) Alloc(ctx context.Context, n int) (*Region, error) {
	const op = "remote.Agent.Alloc"
	if !a.ok() {
		return nil, errNil(op, "Agent")
	}
	if n <= 0 || int64(n) > a.maxReg {
		return nil, &Error{Op: op, Kind: cuda.ErrInvalidValue, Detail: fmt.Sprintf("%d bytes: want 1 to %d (the registration limit)", n, a.maxReg)}
	}
	var r *Region
	err := a.do(ctx, op, func() error {
		m, addr, length, err := a.lib.MemAlloc(a.uctx, uintptr(n))
		if err != nil {
			return &Error{Op: op, Kind: ErrUnavailable, Detail: fmt.Sprintf("UCX could not allocate %d bytes", n), Err: err}
		}
		b, err := pinmem.Register(ucx.Bytes(addr, length), 0)
		if err != nil {
			_ = a.lib.MemUnmap(a.uctx, m)
			return err // pinmem's own: the budget, the driver
		}
		rk, err := a.lib.RkeyPack(a.uctx, m)
		if err != nil {
			_ = b.Free()
			_ = a.lib.MemUnmap(a.uctx, m)
			return &Error{Op: op, Kind: ErrUnavailable, Err: err}
		}
		s := &slab{buf: b, base: addr, n: length, owned: true, refs: 1,
			pieces: []piece{{n: length, memh: m, rkey: rk, node: pagenode.Of(addr, addr+length/2, addr+length-1)}}}
		a.mu.Lock()
		a.nextID++
		s.id = a.nextID
		a.slabs[addr] = s
		a.mu.Unlock()
		s.unhook = freehook.Add(addr, func() error {
			return &Error{Op: "pinmem.Buffer.Free", Kind: ErrBusy, Detail: "the memory belongs to a Region of remote.Agent.Alloc: close the Region"}
		})
		r = &Region{a: a, s: s, n: uintptr(n)}
		return nil
	})
	return r, err
}

// ok reports whether r is a region Register or Alloc made.
func (r *Region) ok() bool { return r != nil && r.a != nil && r.s != nil }

// Bytes returns the region's memory (nil once its buffer was freed, or
// for a nil Region).
func (r *Region) Bytes() []byte {
	if !r.ok() {
		return nil
	}
	b := r.s.buf.Bytes()
	if b == nil {
		return nil
	}
	return b[r.off : r.off+r.n]
}

// dropSlab is the buffer's free hook: it unmaps the slab unless a transfer
// uses it. After the agent closed there is nothing left to drop.
func (a *Agent) dropSlab(s *slab) error {
	err := a.do(context.Background(), "pinmem.Buffer.Free", func() error {
		a.mu.Lock()
		defer a.mu.Unlock()
		if s.dead {
			return nil
		}
		if s.busy > 0 {
			return &Error{Op: "pinmem.Buffer.Free", Kind: ErrBusy, Detail: fmt.Sprintf("%d transfers use the buffer's registration", s.busy)}
		}
		delete(a.slabs, s.base)
		s.unmap(a)
		return nil
	})
	if e, ok := err.(*Error); ok && e.Kind == ErrClosed {
		select {
		case <-a.done:
			return nil // the agent's teardown unmapped it
		default:
			return &Error{Op: "pinmem.Buffer.Free", Kind: ErrBusy, Detail: "the agent holding the buffer's registration is closing (its transfers are in flight)"}
		}
	}
	return err
}

// Len returns the region's size in bytes (0 for a nil Region).
func (r *Region) Len() int64 {
	if !r.ok() {
		return 0
	}
	return int64(r.n)
}

// Registrations returns the registrations under the region, clipped to it,
// with their NUMA nodes (none for a nil Region).
func (r *Region) Registrations() []Registration {
	if !r.ok() {
		return nil
	}
	r.a.mu.Lock()
	defer r.a.mu.Unlock()
	var out []Registration
	for _, p := range r.s.pieces {
		lo, hi := max(p.off, r.off), min(p.off+p.n, r.off+r.n)
		if lo < hi {
			out = append(out, Registration{Offset: int64(lo - r.off), Len: int64(hi - lo), NUMANode: p.node})
		}
	}
	return out
}

// Close closes the region; the buffer's registration is dropped with the
// last Region on it. It fails with ErrBusy, changing nothing, while a
// transfer uses the region.
func (r *Region) Close() error {
	const op = "remote.Region.Close"
	if !r.ok() {
		return errNil(op, "Region")
	}
	return r.a.do(context.Background(), op, func() error {
		a := r.a
		a.mu.Lock()
		defer a.mu.Unlock()
		if r.closed {
			return &Error{Op: op, Kind: ErrClosed, Detail: "already closed"}
		}
		if r.s.busy > 0 {
			return &Error{Op: op, Kind: ErrBusy, Detail: fmt.Sprintf("%d transfers use it", r.s.busy)}
		}
		r.closed = true
		r.s.refs--
		if r.s.refs == 0 && !r.s.dead {
			delete(a.slabs, r.s.base)
			r.s.unmap(a)
		}
		return nil
	})
}

// live reports, under a.mu, why the region cannot be used, or nil.
func (r *Region) live(op string) error {
	switch {
	case r.closed:
		return &Error{Op: op, Kind: ErrClosed, Detail: "the local region is closed"}
	case r.s.dead:
		return &Error{Op: op, Kind: ErrClosed, Detail: "the local region's buffer was freed or its agent closed"}
	}
	return nil
}
