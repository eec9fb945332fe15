package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/kernels"
)

// BlockKernel is the state of CopyBlocks' kernel strategy: pinmem's
// gather/scatter kernel loaded in a context, and a device table of up to
// Cap block descriptors. With it one CopyBlocks is one small upload of
// the table and one kernel launch, whatever the number of blocks; the
// kernel reads and writes the host blocks over PCIe through their device
// addresses, so they must be mapped into the device's address space
// (pinmem.Mapped memory; on a host with unified addressing the driver
// maps all cuMemHostAlloc memory) and the copies use SMs, not the copy
// engines. The kernel is hand-written PTX (internal/kernels/blocks.ptx).
//
// A BlockKernel may serve any stream of its context, one CopyBlocks at a
// time (calls are serialised): each call's table upload waits, on the
// device, for the previous call's kernel to have read the table. Close it
// when done.
type BlockKernel struct {
	ctx   *Context
	mod   *Module
	fn    *Function
	table *DeviceBuffer
	fence *Event // recorded after each launch
	cap   int

	mu     sync.Mutex
	used   bool   // fence was recorded
	desc   []byte // the table's host image, staged by the driver at each upload
	closed bool
}

// blockKernelThreads is the CTA width of the kernel strategy: 256 threads
// move 4 KiB per pass of a block.
const blockKernelThreads = 256

// blockKernelMaxGrid caps the CTAs of one launch; the kernel strides over
// the blocks beyond it.
const blockKernelMaxGrid = 1 << 16

// NewBlockKernel loads the block-copy kernel into c with a table for up to
// maxBlocks blocks per CopyBlocks. A driver that cannot load the PTX (ISA
// 7.0) gives an error matching ErrKernelImage.
func (c *Context) NewBlockKernel(maxBlocks int) (k *BlockKernel, err error) {
	if maxBlocks <= 0 {
		return nil, fmt.Errorf("cuda: block kernel for %d blocks: %w", maxBlocks, ErrInvalidValue)
	}
	if err := c.alive(); err != nil {
		return nil, err
	}
	k = &BlockKernel{ctx: c, cap: maxBlocks, desc: make([]byte, maxBlocks*kernels.BlockDescSize)}
	defer func() {
		if err != nil {
			err = errors.Join(err, k.release())
			k = nil
		}
	}()
	if k.mod, err = c.LoadModule(kernels.BlockCopyImage()); err != nil {
		return k, err
	}
	if k.fn, err = k.mod.Function(kernels.KernelBlockCopy); err != nil {
		return k, err
	}
	if k.table, err = c.Alloc(len(k.desc)); err != nil {
		return k, err
	}
	k.fence, err = c.NewEvent(EventDisableTiming)
	return k, err
}

// Cap returns the most blocks one CopyBlocks can give the kernel.
func (k *BlockKernel) Cap() int {
	if k == nil {
		return 0
	}
	return k.cap
}

// Close waits for the last launch to finish and releases the kernel and
// its table. A second Close returns an error matching ErrInvalidHandle.
func (k *BlockKernel) Close() error {
	if k == nil {
		return fmt.Errorf("cuda: nil block kernel: %w", ErrInvalidValue)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return fmt.Errorf("cuda: block kernel already closed: %w", ErrInvalidHandle)
	}
	if k.used {
		if err := k.fence.Synchronize(); err != nil {
			return err // still in use as far as we know: keep it, Close may be retried
		}
	}
	k.closed = true
	return k.release()
}

// release frees what was made, in reverse order.
func (k *BlockKernel) release() error {
	var errs []error
	if k.fence != nil {
		errs = append(errs, k.fence.Destroy())
	}
	if k.table != nil {
		errs = append(errs, k.table.Free())
	}
	if k.mod != nil {
		errs = append(errs, k.mod.Unload())
	}
	return errors.Join(errs...)
}

// issueKernel queues the blocks on s as one table upload and one launch;
// hostDev[i] is the device address of block i's host memory. It runs with
// s's context current.
func (s *Stream) issueKernel(k *BlockKernel, dir Direction, blocks []BlockCopy, hostDev []uint64, rep *BlockReport) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return fmt.Errorf("cuda: block kernel already closed: %w", ErrInvalidHandle)
	}
	if rep.Blocks > k.cap {
		return fmt.Errorf("cuda: %d blocks for a block kernel of %d: %w", rep.Blocks, k.cap, ErrInvalidValue)
	}
	drv := s.ctx.drv
	n := 0
	for i, b := range blocks {
		if len(b.Host) == 0 {
			continue
		}
		d, h := uint64(b.Dev.ptr)+uint64(b.Off), hostDev[i]
		if dir == DeviceToHost {
			d, h = h, d
		}
		e := k.desc[n*kernels.BlockDescSize:]
		binary.LittleEndian.PutUint64(e, d)     // dst
		binary.LittleEndian.PutUint64(e[8:], h) // src
		binary.LittleEndian.PutUint64(e[16:], uint64(len(b.Host)))
		n++
	}
	rep.Calls = 0
	if k.used {
		// The previous kernel, on whatever stream, must have read the table.
		if err := drv.StreamWaitEvent(s.h, k.fence.h, 0); err != nil {
			return err
		}
		rep.Calls++
	}
	// The driver stages a pageable source before the call returns, so
	// k.desc may be rewritten by the next call.
	if err := drv.MemcpyHtoDAsync(cudadrv.DevicePtr(k.table.ptr), hostPtr(k.desc[:n*kernels.BlockDescSize]), uint64(n*kernels.BlockDescSize), s.h); err != nil {
		return err
	}
	rep.Calls++
	if err := k.fn.Launch(s, D1(min(n, blockKernelMaxGrid)), D1(blockKernelThreads), 0, k.table.ptr, uint32(n)); err != nil {
		return err
	}
	rep.Calls++
	k.used = true // the fence is stale until recorded: Close and the next call wait on it
	return drv.EventRecord(k.fence.h, s.h)
}
