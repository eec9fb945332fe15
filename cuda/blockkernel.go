package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/track"
)

// BlockKernel is the state of CopyBlocks' kernel strategy: pinmem's
// gather/scatter kernel loaded in a context, and two tables of up to Cap
// block descriptors each in pinned, mapped host memory. With it one
// CopyBlocks is one kernel launch, whatever the number of blocks: the
// kernel reads the table and reads and writes the host blocks over PCIe
// through their device addresses, so the host blocks must be mapped into
// the device's address space: allocate them with pinmem.Mapped. (With
// unified addressing the driver also maps memory it allocated with
// cuMemHostAlloc, but pinmem.Alloc pins buffers of AutoMmapThreshold and
// more by mmap and cuMemHostRegister, which maps them only when Mapped is
// asked for.) The copies run on the SMs, not on the copy engines. The kernel is
// hand-written PTX (internal/kernels/blocks.ptx).
//
// The tables are used in turn; before CopyBlocks rewrites one it waits,
// on the CPU, for the kernel that last read it (two calls back) to have
// finished, which is rarely a wait at all. When that kernel's completion
// could not be fenced (the record of its event failed, and so did the
// stream wait that CopyBlocks then made instead), its table is neither
// rewritten nor freed until a wait for all of the context's work
// succeeds: the CopyBlocks that comes back to the table, and Close, make
// that wait and fail with its error while it fails. A BlockKernel may serve any
// stream of its context, one CopyBlocks at a time (calls are
// serialised). Its tables, 2 x 24 x Cap bytes, are pinned by the driver
// outside pinmem's budget. Close it when done.
type BlockKernel struct {
	ctx *Context
	mod *Module
	fn  *Function
	cap int

	mu      sync.Mutex
	slots   [2]blockSlot
	next    int
	closing bool // Close began: launches are refused
	closed  bool // Close released everything
}

// blockSlot is one descriptor table: pinned, mapped host memory, its
// device address, and the event recorded after the launch that read it.
type blockSlot struct {
	host  hostptr.Ptr
	table []byte
	dev   DevicePtr
	done  *Event
	used  bool // done was recorded after the last launch that read the table
	// unfenced: the last launch that read the table is queued with no
	// record of done after it, and the stream wait that stood in for the
	// record failed too, so nothing says when it has read the table. Only
	// a successful wait for the whole context (fence) clears it; until
	// then the table is not rewritten and not freed.
	unfenced bool
}

// fence waits, with the context current, for all of the context's work,
// which includes the unfenced launch that last read sl's table, and
// clears unfenced. On failure the table stays held.
func (sl *blockSlot) fence(drv cudadrv.Driver, i int) error {
	if err := pub(drv.CtxSynchronize()); err != nil {
		return fmt.Errorf("cuda: block kernel table %d may still be read by a launch whose completion could not be recorded, and waiting for the context failed: %w", i, err)
	}
	sl.unfenced, sl.used = false, false
	return nil
}

// blockKernelThreads is the CTA width of the kernel strategy: 256 threads
// move 4 KiB per pass of a block.
const blockKernelThreads = 256

// blockKernelMaxGrid caps the CTAs of one launch; the kernel strides over
// the blocks beyond it.
const blockKernelMaxGrid = 1 << 16

// NewBlockKernel loads the block-copy kernel into c with tables for up to
// maxBlocks blocks per CopyBlocks. A driver that cannot load the PTX (ISA
// 7.0) gives an error matching ErrKernelImage; a device that cannot map
// host memory, one matching ErrNotSupported or the driver's refusal.
func (c *Context) NewBlockKernel(maxBlocks int) (k *BlockKernel, err error) {
	if maxBlocks <= 0 || maxBlocks > 1<<26 {
		return nil, fmt.Errorf("cuda: block kernel for %d blocks: %w", maxBlocks, ErrInvalidValue)
	}
	if err := c.alive(); err != nil {
		return nil, err
	}
	retryKernelOrphans()
	k = &BlockKernel{ctx: c, cap: maxBlocks}
	defer func() {
		if err != nil {
			if rerr := k.release(); rerr != nil {
				// What could not be released is retried by the next NewBlockKernel.
				err = errors.Join(err, rerr)
				kernelOrphans.add(k)
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
	size := maxBlocks * kernels.BlockDescSize
	for i := range k.slots {
		sl := &k.slots[i]
		if sl.done, err = c.NewEvent(EventBlockingSync | EventDisableTiming); err != nil {
			return k, err
		}
		err = c.Do(func() error {
			p, err := pub2(c.drv.MemHostAlloc(uint64(size), cudadrv.MemHostAllocDeviceMap))
			if err != nil {
				return fmt.Errorf("cuda: block kernel table of %d bytes: %w", size, err)
			}
			sl.host, sl.table = p, hostptr.BytesAt(p, uintptr(size))
			track.Add(track.HostAlloc, uint64(hostptr.AddrOf(sl.table)), int64(size))
			d, err := pub2(c.drv.MemHostGetDevicePointer(p, 0))
			if err != nil {
				return fmt.Errorf("cuda: device address of the block kernel's table: %w", err)
			}
			sl.dev = DevicePtr(d)
			return nil
		})
		if err != nil {
			return k, err
		}
	}
	return k, nil
}

// Cap returns the most blocks one CopyBlocks can give the kernel.
func (k *BlockKernel) Cap() int {
	if k == nil {
		return 0
	}
	return k.cap
}

// Close waits for the last launches to finish and releases the kernel and
// its tables. A second Close returns an error matching ErrInvalidHandle;
// when waiting or releasing fails, Close may be retried for what is left
// (the kernel takes no more work either way).
func (k *BlockKernel) Close() error {
	if k == nil {
		return fmt.Errorf("cuda: nil block kernel: %w", ErrInvalidValue)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return fmt.Errorf("cuda: block kernel already closed: %w", ErrInvalidHandle)
	}
	for i := range k.slots {
		sl := &k.slots[i]
		if sl.unfenced {
			if err := k.ctx.Do(func() error { return sl.fence(k.ctx.drv, i) }); err != nil {
				return err // a launch may still read the table: keep it
			}
		}
		if sl.used && sl.done != nil {
			if err := sl.done.Synchronize(context.Background()); err != nil {
				return err // a launch may still read the table: keep it
			}
		}
	}
	k.closing = true // no more launches, even when the release fails
	if err := k.release(); err != nil {
		return err // what is left is released by the next Close
	}
	k.closed = true
	return nil
}

// release frees what was made and forgets each part it freed, so that a
// failed release can be repeated for the rest. A table the driver fails
// to free stays tracked (and is reported as a leak) rather than reused.
func (k *BlockKernel) release() error {
	var errs []error
	for i := range k.slots {
		sl := &k.slots[i]
		if sl.host != nil {
			host, addr := sl.host, uint64(hostptr.AddrOf(sl.table))
			err := k.ctx.Do(func() error { return k.ctx.drv.MemFreeHost(host) })
			if err == nil || k.ctx.destroyed.Load() {
				track.Remove(track.HostAlloc, addr)
				sl.host, sl.table = nil, nil
			}
			errs = append(errs, err)
		}
		if sl.done != nil {
			err := sl.done.Destroy()
			if err == nil || errors.Is(err, ErrInvalidHandle) {
				sl.done, err = nil, nil
			}
			errs = append(errs, err)
		}
	}
	if k.mod != nil {
		err := k.mod.Unload()
		if err == nil || errors.Is(err, ErrInvalidHandle) {
			k.mod, err = nil, nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// kernelOrphans are block kernels whose construction failed and whose
// release failed too (a driver failing every call, say): the next
// NewBlockKernel retries their release, as transfer.New does for its own.
var kernelOrphans orphanKernels

type orphanKernels struct {
	mu sync.Mutex
	ks []*BlockKernel
}

func (o *orphanKernels) add(k *BlockKernel) {
	o.mu.Lock()
	o.ks = append(o.ks, k)
	o.mu.Unlock()
}

// retryKernelOrphans retries every orphan's release, keeping those that
// still hold something.
func retryKernelOrphans() {
	kernelOrphans.mu.Lock()
	ks := kernelOrphans.ks
	kernelOrphans.ks = nil
	kernelOrphans.mu.Unlock()
	for _, k := range ks {
		if k.release() != nil {
			kernelOrphans.add(k)
		}
	}
}

// issueKernel queues the blocks on s as one launch reading the next
// table, one descriptor per piece (pieces[j].dev is the device address of
// its host memory). It runs with s's context current. When it fails
// before the launch is queued, rep says no block was.
func (s *Stream) issueKernel(k *BlockKernel, dir Direction, blocks []BlockCopy, pieces []piece, rep *BlockReport) (err error) {
	launched := false
	defer func() {
		if !launched {
			rep.Blocks, rep.Bytes = 0, 0
		}
	}()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closing {
		return fmt.Errorf("cuda: block kernel already closed: %w", ErrInvalidHandle)
	}
	if len(pieces) > k.cap {
		if len(pieces) > rep.Blocks {
			return fmt.Errorf("cuda: %d blocks, %d descriptors with the blocks whose host memory lies in pinned ranges that do not map to one device range, for a block kernel of %d: %w", rep.Blocks, len(pieces), k.cap, ErrInvalidValue)
		}
		return fmt.Errorf("cuda: %d blocks for a block kernel of %d: %w", rep.Blocks, k.cap, ErrInvalidValue)
	}
	sl := &k.slots[k.next]
	if sl.unfenced {
		if err := sl.fence(s.ctx.drv, k.next); err != nil {
			return err
		}
	}
	if sl.used {
		// The kernel that read this table two calls back must be done.
		if err := pub(s.ctx.drv.EventSynchronize(sl.done.h)); err != nil {
			return err
		}
		sl.used = false
	}
	n := len(pieces)
	for j, p := range pieces {
		b := blocks[p.blk]
		d, h := uint64(b.Dev.ptr)+uint64(b.Off)+uint64(p.off), p.dev
		if dir == DeviceToHost {
			d, h = h, d
		}
		e := sl.table[j*kernels.BlockDescSize:]
		binary.LittleEndian.PutUint64(e, d)     // dst
		binary.LittleEndian.PutUint64(e[8:], h) // src
		binary.LittleEndian.PutUint64(e[16:], uint64(p.n))
	}
	if err := k.fn.Launch(s, D1(min(n, blockKernelMaxGrid)), D1(blockKernelThreads), 0, sl.dev, uint32(n)); err != nil {
		return err
	}
	launched, rep.Calls = true, 1
	k.next ^= 1
	sl.used = true // until recorded, the event says "done" too early: record it before anyone waits
	if err := pub(s.ctx.drv.EventRecord(sl.done.h, s.h)); err != nil {
		// The launch is queued but unfenced: wait for it here, so that the
		// table is not rewritten under it.
		sl.used = false // done does not follow this launch: waiting on it proves nothing
		serr := pub(s.ctx.drv.StreamSynchronize(s.h))
		if serr != nil {
			// The launch may still be queued, and nothing will say when it
			// is done: the table is held until a wait for the whole
			// context succeeds (sl.fence).
			sl.unfenced = true
		}
		return errors.Join(err, serr)
	}
	return nil
}
