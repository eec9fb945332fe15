package transfer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
)

// MappedPointer returns the device address of a Mapped pinned buffer, the
// address a kernel uses to read and write the host memory directly over
// PCIe (zero-copy). A buffer without the Mapped flag gives an error
// matching pinmem.ErrNotMapped.
func MappedPointer(b *pinmem.Buffer) (cuda.DevicePtr, error) {
	if b == nil {
		return 0, fmt.Errorf("transfer: nil buffer: %w", cuda.ErrInvalidValue)
	}
	if b.Flags()&pinmem.Mapped == 0 {
		return 0, fmt.Errorf("transfer: zero-copy needs a buffer pinned with pinmem.Mapped, this one has flags %v: %w", b.Flags(), pinmem.ErrNotMapped)
	}
	return b.DevicePtr()
}

// RunMapped runs device work directly on the Mapped buffer b: work
// enqueues kernels on s (nil: the Copier's stream) using the buffer's
// device address p and length n, and RunMapped returns when they have
// finished, with their error. Waiting goes through the Copier's single
// waiter. On cancellation RunMapped still waits for the work (it uses the
// host memory), then returns ctx.Err().
func (c *Copier) RunMapped(ctx context.Context, s *cuda.Stream, b *pinmem.Buffer, work func(s *cuda.Stream, p cuda.DevicePtr, n int) error) error {
	if err := c.begin(); err != nil {
		return err
	}
	defer c.active.Done()
	if ctx == nil {
		ctx = context.Background()
	}
	p, err := MappedPointer(b)
	if err != nil {
		return err
	}
	if s == nil {
		if err := c.acquire(ctx); err != nil {
			return err
		}
		defer c.releaseRing()
		s = c.stream
	}
	ev, err := c.cctx.NewEvent(cuda.EventBlockingSync | cuda.EventDisableTiming)
	if err != nil {
		return err
	}
	defer ev.Destroy()
	werr := work(s, p, b.Len())
	if err := ev.Record(s); err != nil {
		return errors.Join(werr, err, s.Synchronize())
	}
	err = c.w.wait(ctx, ev)
	if err != nil && ctx.Err() != nil {
		// Cancelled: the kernels still use the buffer; wait for them anyway.
		err = errors.Join(ctx.Err(), c.w.wait(context.Background(), ev))
	}
	if werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	return s.Synchronize()
}

// ZeroCopyRow is one line of CompareZeroCopy's table: the same kernel
// reading Bytes of host data Reuse times, either directly from mapped
// pinned memory (each pass crosses PCIe) or after one explicit copy to
// device memory (only the copy crosses PCIe).
type ZeroCopyRow struct {
	Reuse    int
	Bytes    int
	ZeroCopy time.Duration // median over the repetitions
	Explicit time.Duration // median: the copy plus Reuse kernel passes on device memory
}

// ZeroCopyGBps is the zero-copy speed in GB/s of host data per pass.
func (r ZeroCopyRow) ZeroCopyGBps() float64 { return gbps(r.Bytes*r.Reuse, r.ZeroCopy) }

// ExplicitGBps is the explicit-copy speed in GB/s of host data per pass.
func (r ZeroCopyRow) ExplicitGBps() float64 { return gbps(r.Bytes*r.Reuse, r.Explicit) }

// Winner returns "zero-copy" or "explicit".
func (r ZeroCopyRow) Winner() string {
	if r.ZeroCopy < r.Explicit {
		return "zero-copy"
	}
	return "explicit"
}

// String formats the row as one line of the table.
func (r ZeroCopyRow) String() string {
	return fmt.Sprintf("reuse %d, %d bytes: zero-copy %v (%.1f GB/s), explicit %v (%.1f GB/s): %s wins by %.2fx",
		r.Reuse, r.Bytes, r.ZeroCopy, r.ZeroCopyGBps(), r.Explicit, r.ExplicitGBps(), r.Winner(),
		float64(max(r.ZeroCopy, r.Explicit))/float64(max(min(r.ZeroCopy, r.Explicit), 1)))
}

func gbps(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds() / 1e9
}

// CompareZeroCopy measures, on context c, a kernel (read_sum_u32) reading
// size bytes of host data reuse times for each reuse factor: directly from
// a Mapped pinned buffer, and from device memory after one explicit copy of
// the same pinned buffer. Each cell is the median of reps runs timed with
// events; the kernel's sum is checked against the host's. It needs the
// embedded kernels (an error matching cuda.ErrKernelImage otherwise).
func CompareZeroCopy(ctx context.Context, c *cuda.Context, size int, reuses []int, reps int) (rows []ZeroCopyRow, err error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if size < 4 || size%4 != 0 || reps < 1 {
		return nil, fmt.Errorf("transfer: CompareZeroCopy size %d (a positive multiple of 4), reps %d: %w", size, reps, cuda.ErrInvalidValue)
	}
	var cleanup []func() error
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			err = errors.Join(err, cleanup[i]())
		}
	}()
	mod, err := c.LoadModule(kernels.Image())
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, mod.Unload)
	fn, err := mod.Function(kernels.KernelReadSum)
	if err != nil {
		return nil, err
	}
	props, err := c.Device().Properties()
	if err != nil {
		return nil, err
	}
	host, err := pinmem.Alloc(size, pinmem.Mapped|pinmem.Portable, pinmem.WithDevice(c.Device()))
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, host.Free)
	hp, err := host.DevicePtr()
	if err != nil {
		return nil, err
	}
	words, err := pinmem.View[uint32](host)
	if err != nil {
		return nil, err
	}
	kernels.FillPattern(words, 7)
	want := kernels.Sum(words)
	dev, err := c.Alloc(size)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, dev.Free)
	out, err := c.Alloc(8)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, out.Free)
	s, err := c.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, s.Destroy)
	var evs [2]*cuda.Event
	for i := range evs {
		if evs[i], err = c.NewEvent(cuda.EventBlockingSync); err != nil {
			return nil, err
		}
		cleanup = append(cleanup, evs[i].Destroy)
	}
	grid, block := cuda.D1(max(1, props.Multiprocessors)*4), cuda.D1(256)
	nw := uint64(size / 4)
	pass := func(src cuda.DevicePtr) error {
		return fn.Launch(s, grid, block, 0, src, nw, out.Ptr())
	}
	timed := func(explicit bool, reuse int) (time.Duration, error) {
		if err := s.Memset(out.Ptr(), 0, 8); err != nil {
			return 0, err
		}
		if err := evs[0].Record(s); err != nil {
			return 0, err
		}
		src := hp
		if explicit {
			if err := s.CopyHtoD(dev.Ptr(), host.Bytes()); err != nil {
				return 0, err
			}
			src = dev.Ptr()
		}
		for range reuse {
			if err := pass(src); err != nil {
				return 0, err
			}
		}
		if err := evs[1].Record(s); err != nil {
			return 0, err
		}
		if err := evs[1].Synchronize(); err != nil {
			return 0, err
		}
		var sum [8]byte
		if err := out.Read(0, sum[:]); err != nil {
			return 0, err
		}
		got := uint64(sum[0]) | uint64(sum[1])<<8 | uint64(sum[2])<<16 | uint64(sum[3])<<24 |
			uint64(sum[4])<<32 | uint64(sum[5])<<40 | uint64(sum[6])<<48 | uint64(sum[7])<<56
		if got != want*uint64(reuse) {
			return 0, fmt.Errorf("transfer: read_sum_u32 over %d bytes x %d (explicit %v) summed %#x, want %#x", size, reuse, explicit, got, want*uint64(reuse))
		}
		return evs[1].Elapsed(evs[0])
	}
	// Warm up both paths once (JIT, first-touch mappings).
	for _, explicit := range []bool{false, true} {
		if _, err := timed(explicit, 1); err != nil {
			return nil, err
		}
	}
	for _, r := range reuses {
		if r < 1 {
			return rows, fmt.Errorf("transfer: reuse factor %d: %w", r, cuda.ErrInvalidValue)
		}
		row := ZeroCopyRow{Reuse: r, Bytes: size}
		var zc, ex []time.Duration
		for range reps {
			if err := ctx.Err(); err != nil {
				return rows, err
			}
			d, err := timed(false, r)
			if err != nil {
				return rows, err
			}
			zc = append(zc, d)
			if d, err = timed(true, r); err != nil {
				return rows, err
			}
			ex = append(ex, d)
		}
		row.ZeroCopy, row.Explicit = median(zc), median(ex)
		rows = append(rows, row)
	}
	return rows, nil
}

// median returns the median of v (the upper one of an even count; zero
// when v is empty), leaving v as it is.
func median[T cmp.Ordered](v []T) T {
	if len(v) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
