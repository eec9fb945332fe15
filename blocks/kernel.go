package blocks

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudaerr"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/lifecycle"
	"github.com/pinmem/pinmem/internal/track"
)

// kernel is the Kernel strategy's state: pinmem's gather/scatter kernel
// (hand-written PTX, internal/kernels/blocks.ptx) loaded in a context,
// and descriptor tables in pinned, mapped host memory, which the kernel
// reads through their device addresses. The tables are pinned by the
// first call that launches the kernel (pin), not by New, so that a Copier
// whose copies never take the kernel pins nothing. Each list takes the
// next table; before rewriting one, issue waits for the launch that last
// read it (four lists back), which is rarely a wait at all. The Copier's
// turn serialises its use.
type kernel struct {
	ctx   *cuda.Context
	mod   *cuda.Module
	fn    *cuda.Function
	cap   int
	sms   int // the device's multiprocessors, the most CTAs a launch runs (kernelGrid)
	slots [kernelTables]slot
	next  int
}

// kernelTables is how many descriptor tables a kernel takes in turn: a
// both-ways call takes two, and the next call can be queued while the
// last one runs.
const kernelTables = 4

// slot is one descriptor table, and the event recorded after the launch
// that last read it.
type slot struct {
	host  hostptr.Ptr
	table []byte
	dev   cuda.DevicePtr
	done  *cuda.Event
	used  bool // done was recorded after the last launch that read the table
	// unfenced: the last launch that read the table is queued with no
	// record of done after it (the record failed), so nothing says when it
	// has read the table. Only a successful wait for the whole context
	// clears it; until then the table is not rewritten and not freed.
	unfenced bool
}

// kernelThreads is the CTA width of the kernel: 256 threads move 4 KiB
// per pass of a block.
const kernelThreads = 256

// kernelGrid is how many CTAs a launch runs for a list of n pieces on a
// device of sms multiprocessors: one per SM at most, the kernel striding
// over the blocks beyond. Measured on an H100 (132 SMs) with
// internal/kernels/testdata/blockshape.cu, 4096 blocks of 16 KiB: one way,
// every grid from 132 to 4096 CTAs moves the same (33 GB/s host to device,
// 52 device to host); both ways at once, two launches of one CTA per block
// fill the SMs with the first launch's CTAs and run nearly one after the
// other (41 GB/s), while two of one CTA per SM run side by side (52 GB/s).
// 512 blocks of 2 MiB, one CTA per block against one per SM: both ways 44
// against 48 GB/s, host to device 30 against 33.
func kernelGrid(n, sms int) int { return max(1, min(n, sms)) }

func newKernel(c *cuda.Context, maxBlocks int) (k *kernel, err error) {
	lifecycle.RetryOrphans()
	// The tables are pinned later, as mapped host memory: a device that
	// cannot map host memory is refused now, as the tables' pinning was.
	if can, err := c.Device().Attribute(cuda.AttrCanMapHostMemory); err != nil {
		return nil, err
	} else if can == 0 {
		return nil, fmt.Errorf("blocks: the kernel reads its tables from mapped host memory, which %v cannot map: %w", c.Device(), cuda.ErrNotSupported)
	}
	sms, err := c.Device().Attribute(cuda.AttrMultiprocessorCount)
	if err != nil {
		return nil, err
	}
	k = &kernel{ctx: c, cap: maxBlocks, sms: sms}
	defer func() {
		if err != nil {
			if rerr := k.release(); rerr != nil {
				// What could not be released is retried by the next
				// constructor (lifecycle.RetryOrphans).
				err = errors.Join(err, rerr)
				orphan := k // k is cleared below
				lifecycle.Orphan(func() bool { return orphan.release() == nil })
			}
			k = nil
		}
	}()
	if k.mod, err = c.LoadModule(kernels.BlockCopyImage()); err != nil {
		return k, err
	}
	if k.fn, err = k.mod.Function(kernels.KernelBlockCopy); err != nil {
		return k, err
	}
	for i := range k.slots {
		if k.slots[i].done, err = c.NewEvent(cuda.EventBlockingSync | cuda.EventDisableTiming); err != nil {
			return k, err
		}
	}
	return k, nil
}

// pin pins the tables not pinned yet, cap descriptors each, in mapped
// host memory (cuMemHostAlloc DEVICEMAP, outside pinmem's budget): the
// first call that launches the kernel pins all four, once, and they stay
// pinned until close. The Copier's turn serialises it with the launches
// and Close. It stops when ctx ends before a table (one can take a
// second to pin). A table pinned before an error stays, freed by close;
// the next call pins the rest.
func (k *kernel) pin(ctx context.Context) error {
	if k.slots[len(k.slots)-1].dev != 0 { // pinned in order: all are
		return nil
	}
	drv, err := cudaerr.Public2(cudadrv.Get())
	if err != nil {
		return err
	}
	size := k.cap * kernels.BlockDescSize
	for i := range k.slots {
		sl := &k.slots[i]
		if sl.dev != 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("blocks: canceled while pinning the kernel's tables: %w", err)
		}
		err := k.ctx.Do(func() error {
			if sl.host == nil {
				p, err := cudaerr.Public2(drv.MemHostAlloc(uint64(size), cudadrv.MemHostAllocDeviceMap))
				if err != nil {
					return fmt.Errorf("blocks: kernel table of %d bytes: %w", size, err)
				}
				sl.host, sl.table = p, hostptr.BytesAt(p, uintptr(size))
				track.Add(track.HostAlloc, addrOf(sl.table), int64(size))
			}
			d, err := cudaerr.Public2(drv.MemHostGetDevicePointer(sl.host, 0))
			if err != nil {
				return fmt.Errorf("blocks: device address of the kernel's table: %w", err)
			}
			sl.dev = cuda.DevicePtr(d)
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// ready waits, bounded by ctx, until no launch reads sl's table any more.
// A finished launch is no wait: its event is asked first, so that a ctx
// that has ended fails only a call that would wait (as take does).
func (k *kernel) ready(ctx context.Context, sl *slot) error {
	if sl.unfenced {
		if err := k.ctx.Synchronize(ctx); err != nil {
			return fmt.Errorf("blocks: a kernel table may still be read by a launch whose completion could not be recorded, and waiting for the context failed: %w", err)
		}
		sl.unfenced, sl.used = false, false
	}
	if sl.used {
		done, err := sl.done.Query()
		if err == nil && !done {
			err = sl.done.Synchronize(ctx)
		}
		if err != nil {
			return err
		}
		sl.used = false
	}
	return nil
}

// overflow returns the first of the nlists lists whose pieces (kernel
// descriptors) a table does not hold, or -1 when the tables hold every
// list.
func (k *kernel) overflow(sc *scratch, nlists int) int {
	for l := range nlists {
		if len(sc.listPieces(l)) > k.cap {
			return l
		}
	}
	return -1
}

// issue launches the kernel once per list, each launch reading the next
// table, one descriptor per piece. Lists of no blocks launch nothing.
func (k *kernel) issue(ctx context.Context, lists []List, sc *scratch, rep *Report) error {
	if l := k.overflow(sc, len(lists)); l >= 0 {
		return argErr(l, -1, "%d kernel descriptors (blocks, and one more per boundary between pinned ranges a block crosses), the copier's kernel holds %d", len(sc.listPieces(l)), k.cap)
	}
	if err := k.pin(ctx); err != nil {
		return err
	}
	for l, list := range lists {
		ps := sc.listPieces(l)
		if len(ps) == 0 {
			continue
		}
		sl := &k.slots[k.next]
		if err := k.ready(ctx, sl); err != nil {
			return err
		}
		for j, p := range ps {
			dst, src := p.dev, p.host
			if list.toHost {
				dst, src = src, dst
			}
			e := sl.table[j*kernels.BlockDescSize:]
			binary.LittleEndian.PutUint64(e, dst)
			binary.LittleEndian.PutUint64(e[8:], src)
			binary.LittleEndian.PutUint64(e[16:], p.n)
		}
		if err := k.fn.Launch(list.s, cuda.D1(kernelGrid(len(ps), k.sms)), cuda.D1(kernelThreads), 0, sl.dev, uint32(len(ps))); err != nil {
			return fmt.Errorf("blocks: list %d: %w", l, err)
		}
		rep.Calls++
		k.next = (k.next + 1) % kernelTables
		if err := sl.done.Record(list.s); err != nil {
			// The launch is queued and nothing says when it has read the
			// table: it is held until a wait for the whole context.
			sl.unfenced = true
			return fmt.Errorf("blocks: list %d: recording the end of the launch: %w", l, err)
		}
		sl.used = true
	}
	return nil
}

// close waits, bounded by ctx, for the launches that last read the tables
// and releases the kernel. On failure it can be called again.
func (k *kernel) close(ctx context.Context) error {
	for i := range k.slots {
		if err := k.ready(ctx, &k.slots[i]); err != nil {
			return err // a launch may still read the table: keep it
		}
	}
	return k.release()
}

// release frees what was made and forgets each part it freed, so that a
// failed release can be repeated for the rest.
func (k *kernel) release() error {
	drv, err := cudaerr.Public2(cudadrv.Get())
	if err != nil {
		return err
	}
	var errs []error
	for i := range k.slots {
		sl := &k.slots[i]
		if sl.host != nil {
			host, addr := sl.host, addrOf(sl.table)
			err := k.ctx.Do(func() error { return drv.MemFreeHost(host) })
			// A destroyed context took its memory with it.
			if err == nil || errors.Is(err, cuda.ErrInvalidHandle) {
				err = nil
				track.Remove(track.HostAlloc, addr)
				sl.host, sl.table, sl.dev = nil, nil, 0
			}
			errs = append(errs, err)
		}
		if sl.done != nil {
			err := sl.done.Destroy()
			if err == nil || errors.Is(err, cuda.ErrInvalidHandle) {
				sl.done, err = nil, nil
			}
			errs = append(errs, err)
		}
	}
	if k.mod != nil {
		err := k.mod.Destroy()
		if err == nil || errors.Is(err, cuda.ErrInvalidHandle) {
			k.mod, err = nil, nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
