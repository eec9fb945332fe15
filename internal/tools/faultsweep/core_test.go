package faultsweep_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// allocOp pins size bytes with flags and the options opts returns,
// writes and reads them back through each of the buffer's views, and
// frees them.
func allocOp(name string, size int, flags pinmem.Flags, opts func(e *env) []pinmem.Option) op {
	return op{name: fmt.Sprintf("Alloc(%d,%v,%s)", size, flags, name), run: func(e *env) error {
		b, err := pinmem.Alloc(size, flags, opts(e)...)
		if err != nil {
			return err
		}
		e.defer_(b.Free)
		return errors.Join(useBuffer(b, flags), b.Free())
	}}
}

// useBuffer checks what a caller reads back from a pinned buffer: its
// bytes, its segments, a typed view and, for mapped memory, its device
// address.
func useBuffer(b *pinmem.Buffer, flags pinmem.Flags) error {
	copy(b.Bytes(), "pinmem")
	if !bytes.HasPrefix(b.Bytes(), []byte("pinmem")) {
		return errors.New("pinned memory does not hold what was written")
	}
	var n int
	for _, seg := range b.Segments() {
		n += len(seg)
	}
	if n != b.Len() {
		return fmt.Errorf("segments hold %d bytes of %d", n, b.Len())
	}
	if v, err := pinmem.View[uint32](b); err != nil {
		return err
	} else if len(v) != b.Len()/4 {
		return fmt.Errorf("view of %d uint32 for %d bytes", len(v), b.Len())
	}
	if flags&pinmem.Mapped != 0 {
		if _, err := b.DevicePtr(); err != nil {
			return err
		}
	}
	return nil
}

// registerOp registers a Go slice with flags, uses it and unregisters it.
func registerOp(size int, flags pinmem.Flags) op {
	return op{name: fmt.Sprintf("Register(%d,%v)", size, flags), run: func(e *env) error {
		mem := make([]byte, size)
		b, err := pinmem.Register(mem, flags)
		if err != nil {
			return err
		}
		e.defer_(b.Free)
		return errors.Join(useBuffer(b, flags), b.Free())
	}}
}

// registerOverlapOp registers a slice, fails to register a range inside
// it (before any driver call), and registers that range once the first
// registration is gone.
func registerOverlapOp() op {
	return op{name: "Register overlapping", run: func(e *env) error {
		mem := make([]byte, 256<<10)
		b, err := pinmem.Register(mem, 0)
		if err != nil {
			return err
		}
		e.defer_(b.Free)
		if c, err := pinmem.Register(mem[64<<10:], 0); !errors.Is(err, cuda.ErrAlreadyRegistered) {
			if err == nil {
				err = c.Free()
			}
			return errors.Join(fmt.Errorf("registering an overlapping range: %v, want cuda.ErrAlreadyRegistered", err), b.Free())
		}
		if err := b.Free(); err != nil {
			return err
		}
		c, err := pinmem.Register(mem[64<<10:], 0)
		if err != nil {
			return err
		}
		e.defer_(c.Free)
		return c.Free()
	}}
}

// allocFlagSets are the flag combinations Alloc accepts with method m:
// write-combined memory only comes from cuMemHostAlloc, read-only memory
// only from registration.
func allocFlagSets(m pinmem.Method) []pinmem.Flags {
	var sets []pinmem.Flags
	for f := pinmem.Flags(0); f <= pinmem.Portable|pinmem.Mapped|pinmem.WriteCombined|pinmem.ReadOnly; f++ {
		wc, ro := f&pinmem.WriteCombined != 0, f&pinmem.ReadOnly != 0
		if (wc && ro) || (m == pinmem.MethodHostAlloc && ro) || (m == pinmem.MethodMmapRegister && wc) {
			continue
		}
		sets = append(sets, f)
	}
	return sets
}

func TestSweepHostMemory(t *testing.T) {
	var ops []op
	for _, m := range []pinmem.Method{pinmem.MethodAuto, pinmem.MethodHostAlloc, pinmem.MethodMmapRegister} {
		for _, f := range allocFlagSets(m) {
			ops = append(ops, allocOp(m.String(), 1<<20, f, func(*env) []pinmem.Option { return []pinmem.Option{pinmem.WithMethod(m)} }))
		}
	}
	// Below the threshold MethodAuto takes cuMemHostAlloc; the device and
	// thread options go through the mmap path.
	ops = append(ops, allocOp("auto", 64<<10, 0, func(*env) []pinmem.Option { return nil }),
		allocOp("device,threads", 4<<20, pinmem.Mapped, func(e *env) []pinmem.Option {
			return []pinmem.Option{pinmem.WithMethod(pinmem.MethodMmapRegister), pinmem.WithDevice(e.ctx.Device()), pinmem.WithThreads(2)}
		}),
		allocOp("hugepages,numa", 4<<20, 0, func(e *env) []pinmem.Option {
			return []pinmem.Option{pinmem.WithMethod(pinmem.MethodMmapRegister), pinmem.WithHugePages(true), pinmem.WithNUMANode(pinmem.NUMAAuto), pinmem.WithNUMABind(true)}
		}))
	for f := pinmem.Flags(0); f <= pinmem.Portable|pinmem.Mapped|pinmem.ReadOnly; f++ {
		if f&pinmem.WriteCombined == 0 {
			ops = append(ops, registerOp(256<<10, f))
		}
	}
	ops = append(ops, registerOverlapOp())
	sweep(t, ops)
}

// deviceMemOp covers device memory: allocation, synchronous and
// stream-ordered copies, memsets, slices.
func deviceMemOp() op {
	return op{name: "device memory", run: func(e *env) error {
		d, err := e.ctx.Alloc(64 << 10)
		if err != nil {
			return err
		}
		e.defer_(d.Free)
		src := testutil.RandomBytes(64<<10, 1)
		if _, err := d.WriteAt(src, 0); err != nil {
			return err
		}
		got := make([]byte, len(src))
		if _, err := d.ReadAt(got, 0); err != nil {
			return err
		}
		if !bytes.Equal(got, src) {
			return errors.New("device round trip lost data")
		}
		sl, err := d.Slice(4096, 4096)
		if err != nil {
			return err
		}
		if err := sl.Memset(7); err != nil {
			return err
		}
		if _, err := d.ReadAt(got[:1], 4096); err != nil {
			return err
		}
		if got[0] != 7 {
			return errors.New("memset of a slice did not reach its parent")
		}
		d2, err := e.ctx.Alloc(64 << 10)
		if err != nil {
			return err
		}
		e.defer_(d2.Free)
		s, err := e.ctx.NewStream(cuda.StreamBlocking)
		if err != nil {
			return err
		}
		e.defer_(s.Destroy)
		if err := s.CopyDtoD(d2, 0, d, 0, d.Size()); err != nil {
			return errors.Join(err, s.Synchronize(context.Background()))
		}
		if err := s.Memset(d2, 0, 1, 16); err != nil {
			return errors.Join(err, s.Synchronize(context.Background()))
		}
		return errors.Join(s.Synchronize(context.Background()), s.Destroy(), d2.Free(), d.Free())
	}}
}

// streamEventOp covers streams and events: recording, waiting across
// streams, queries, elapsed time.
func streamEventOp() op {
	return op{name: "streams and events", run: func(e *env) error {
		host, err := pinmem.Alloc(64<<10, 0)
		if err != nil {
			return err
		}
		e.defer_(host.Free)
		d, err := e.ctx.Alloc(64 << 10)
		if err != nil {
			return err
		}
		e.defer_(d.Free)
		s1, err := e.ctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		e.defer_(s1.Destroy)
		s2, err := e.ctx.NewStream(cuda.StreamBlocking)
		if err != nil {
			return err
		}
		e.defer_(s2.Destroy)
		start, err := e.ctx.NewEvent(cuda.EventDefault)
		if err != nil {
			return err
		}
		e.defer_(start.Destroy)
		end, err := e.ctx.NewEvent(cuda.EventBlockingSync)
		if err != nil {
			return err
		}
		e.defer_(end.Destroy)
		sync := func(err error) error {
			return errors.Join(err, s1.Synchronize(context.Background()), s2.Synchronize(context.Background()))
		}
		if err := start.Record(s1); err != nil {
			return sync(err)
		}
		if err := s1.CopyHtoD(d, 0, host.Bytes()); err != nil {
			return sync(err)
		}
		if err := end.Record(s1); err != nil {
			return sync(err)
		}
		if err := s2.WaitEvent(end); err != nil {
			return sync(err)
		}
		if err := s2.CopyDtoH(host.Bytes(), d, 0); err != nil {
			return sync(err)
		}
		if err := end.Synchronize(context.Background()); err != nil {
			return sync(err)
		}
		if done, err := end.Query(); err != nil || !done {
			return sync(errors.Join(err, fmt.Errorf("event not done after its Synchronize")))
		}
		if _, err := end.Elapsed(start); err != nil {
			return sync(err)
		}
		if _, err := s2.Query(); err != nil {
			return sync(err)
		}
		return errors.Join(sync(nil), end.Destroy(), start.Destroy(), s2.Destroy(), s1.Destroy(), d.Free(), host.Free())
	}}
}

// moduleOp loads a module, launches a kernel that writes device memory,
// checks what it wrote and unloads the module.
func moduleOp() op {
	return op{name: "module and launch", run: func(e *env) error {
		d, err := e.ctx.Alloc(4096)
		if err != nil {
			return err
		}
		e.defer_(d.Free)
		s, err := e.ctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		e.defer_(s.Destroy)
		mod, err := e.ctx.LoadModule([]byte("// sweep module\n"))
		if err != nil {
			return err
		}
		e.defer_(mod.Destroy)
		f, err := mod.Function("sweep_fill")
		if err != nil {
			return err
		}
		if err := f.Launch(s, cuda.D1(1), cuda.D1(32), 0, d.Ptr(), uint32(0x5a)); err != nil {
			return errors.Join(err, s.Synchronize(context.Background()))
		}
		if err := s.Synchronize(context.Background()); err != nil {
			return err
		}
		got := make([]byte, 16)
		if _, err := d.ReadAt(got, 0); err != nil {
			return err
		}
		if !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, 16)) {
			return fmt.Errorf("kernel wrote %x", got)
		}
		return errors.Join(mod.Destroy(), s.Destroy(), d.Free())
	}}
}

// contextOp creates a context of its own, works in it and destroys it.
func contextOp() op {
	return op{name: "context", run: func(e *env) error {
		dev := e.ctx.Device()
		if _, err := dev.Attribute(cuda.AttrMaxThreadsPerBlock); err != nil {
			return err
		}
		c, err := cuda.NewContext(dev, cuda.SchedAuto)
		if err != nil {
			return err
		}
		e.defer_(c.Destroy)
		d, err := c.Alloc(4096)
		if err != nil {
			return err
		}
		e.defer_(d.Free)
		if _, _, err := c.MemInfo(); err != nil {
			return err
		}
		if err := c.Do(func() error { return d.Memset(0) }); err != nil {
			return err
		}
		if err := c.Synchronize(context.Background()); err != nil {
			return err
		}
		// Free before Destroy, and Destroy only once Free succeeded: the
		// cleanups retry both, in that order.
		if err := d.Free(); err != nil {
			return err
		}
		return c.Destroy()
	}}
}

func TestSweepDevice(t *testing.T) {
	sweep(t, []op{deviceMemOp(), streamEventOp(), moduleOp(), contextOp()})
}
