// Package blocks copies lists of blocks between pinned host memory and
// device memory, as an inference server pages its KV cache out to host
// memory and back in: each list is queued on its stream as one unit,
// scattered on both sides, and a call can move lists both ways at once on
// two streams.
//
// Queuing one driver copy per block costs 1.3-2 us of CPU per block, while
// a 16 KiB block takes 0.3 us on the bus. A Copier queues a list in one of
// three ways (Strategy): with the driver's batch copy (cuMemcpyBatchAsync,
// CUDA 12.8+), up to 1024 blocks a call; with one copy per block, crossing
// from Go into the driver once per 16 blocks; or, given a kernel
// (WithKernel), with one launch of a gather/scatter kernel that moves the
// blocks over mapped host memory with the SMs. Report says which ran. A
// Copier pins no memory of its own until a Copy launches its kernel: then
// the kernel's 4 descriptor tables, 24 bytes per block of WithKernel's
// maxBlocks each, stay pinned until Close.
//
// A typical page-out and page-in, both at once:
//
//	bc, err := blocks.New(gpu)
//	...
//	rep, err := bc.Copy(ctx, blocks.ToHost(outStream, evicted), blocks.ToDevice(inStream, restored))
//	...
//	err = outStream.Synchronize(ctx) // the evicted blocks are in host memory now
//
// Copy checks every list before it queues anything and refuses bad input
// with an *ArgError, which matches cuda.ErrInvalidValue: a nil, freed or
// foreign device buffer, a block outside its buffer, a nil, destroyed or
// foreign stream, host memory that is not pinned all through (the
// driver's pointer attributes decide, so memory pinned by pinmem and by
// other libraries is accepted alike), or a byte that one copy of the call
// writes and another reads or writes. Host memory that is not pinned goes
// through package transfer instead. New refuses a bad option with a
// *pinmem.OptionError naming it, which matches cuda.ErrInvalidValue too.
package blocks

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudaerr"
	"github.com/pinmem/pinmem/internal/enumtext"
)

// Block is one block of a list: the len(Host) bytes of pinned host memory
// at Host and as many bytes at offset Off of the device buffer Dev. A
// block with an empty Host copies nothing.
type Block struct {
	Host []byte
	Dev  *cuda.DeviceBuffer
	Off  int
}

// List is a list of blocks to copy one way on one stream; ToDevice and
// ToHost make one.
type List struct {
	s      *cuda.Stream
	toHost bool
	blocks []Block
}

// ToDevice returns the list that copies each block's host memory into its
// device memory on s (page in).
func ToDevice(s *cuda.Stream, blocks []Block) List { return List{s: s, blocks: blocks} }

// ToHost returns the list that copies each block's device memory into its
// host memory on s (page out).
func ToHost(s *cuda.Stream, blocks []Block) List { return List{s: s, toHost: true, blocks: blocks} }

// Strategy is how a Copier hands a list's copies to the driver.
type Strategy uint8

// Strategies of a Copier.
const (
	// Auto takes Kernel when the Copier has a kernel (WithKernel) whose
	// tables hold every list, the call's mean block is under 256 KiB and
	// every host block is mapped (pinmem.Mapped); otherwise DriverBatch when the driver has it, no
	// list is on the legacy default stream and the mean block is at most
	// 1 MiB; otherwise PerCopy. For small blocks the kernel is 2-3.5x the
	// driver's batch: give the Copier WithKernel and allocate the host
	// blocks with pinmem.Mapped.
	Auto Strategy = iota
	// DriverBatch queues a list with cuMemcpyBatchAsync (cuMemcpyBatchAsync_v2
	// on CUDA 13), up to 1024 copies a call. A driver older than 12.8
	// answers an error matching cuda.ErrNotSupported.
	DriverBatch
	// PerCopy queues one cuMemcpyHtoDAsync/DtoHAsync per block, 16 per
	// crossing from Go into C.
	PerCopy
	// Kernel launches pinmem's gather/scatter kernel once per list; it
	// copies the blocks with the SMs over mapped host memory, so the host
	// blocks must be mapped (pinmem.Mapped). It needs WithKernel.
	Kernel
)

var strategyNames = []string{"auto", "driver-batch", "per-copy", "kernel"}

// String returns the strategy's name: "auto", "driver-batch", "per-copy" or "kernel".
func (s Strategy) String() string {
	if int(s) < len(strategyNames) {
		return strategyNames[s]
	}
	return fmt.Sprintf("Strategy(%d)", uint8(s))
}

// MarshalText encodes the strategy as String does; a value that is no
// strategy is an error matching cuda.ErrInvalidValue.
func (s Strategy) MarshalText() ([]byte, error) {
	if int(s) >= len(strategyNames) {
		return nil, fmt.Errorf("blocks: %s is no Strategy: %w", s, cuda.ErrInvalidValue)
	}
	return []byte(s.String()), nil
}

// UnmarshalText parses a name String returns, without regard to case; an
// unknown name is a *pinmem.NameError (matching cuda.ErrInvalidValue).
func (s *Strategy) UnmarshalText(b []byte) error {
	i := enumtext.Index(strategyNames, string(b))
	if i < 0 {
		return &pinmem.NameError{Type: "blocks.Strategy", Name: string(b), Known: strategyNames}
	}
	*s = Strategy(i)
	return nil
}

// kernelMax is the mean block, in bytes, from which Auto takes a DMA
// strategy even when the Copier has a kernel. Measured on an H100 (PCIe
// Gen5, 4096 blocks, pinmem bench blocks): at 16 KiB the kernel moved
// 26.7 GB/s host to device against the driver's batch 13.7, 38.4 against
// 28.9 device to host and 30.7 against 8.8 both ways at once; at 256 KiB
// and above the copy engines are within a few percent of the link one way
// (C batch 49.5 / 49.9 GB/s at 256 KiB, 53.8 / 54.4 at 2 MiB), where an
// SM kernel over mapped memory peaks at 51-52 GB/s, and both ways at once
// they beat it (2 MiB: 66.7 GB/s by DMA, 0.915 of the bidirectional
// bound; vLLM saw 83.4 by DMA against 68.5 by kernel on its H100).
const kernelMax = 256 << 10

// batchMax is the largest mean block, in bytes, for which Auto takes the
// driver's batch copy. Below it the per-call cost of one copy per block
// (1.3-2 us on an H200 host) is a large share of a block's bus time (a 16
// KiB block takes 0.3 us, a 256 KiB one about 5 us). From 1 MiB on (20 us
// of bus time per block) that cost is under a tenth of the transfer, and
// one copy per block, which every driver has and whose first copies start
// while later ones are still being queued, is as fast.
const batchMax = 1 << 20

// batchCall is the most copies one driver batch call queues: a call's
// lists are queued in turns of this many, so that a stream whose queue is
// full does not hold back the other list.
const batchCall = 1024

// Report says how a Copy queued its lists.
type Report struct {
	// Strategy is the one that queued the copies (Auto only when there
	// was nothing to copy).
	Strategy Strategy
	// Blocks is how many blocks were queued (empty ones not counted).
	Blocks int
	// Bytes is how many bytes they hold.
	Bytes int64
	// Calls is how many driver calls queued them: the batch calls, one
	// per copy for PerCopy (one per block, and one more for each boundary
	// between two pinned ranges that a block crosses), the launches.
	Calls int
}

// ArgError is an argument Copy or Close refused before doing anything, or
// New's nil context (New's options are refused with a *pinmem.OptionError).
// It matches cuda.ErrInvalidValue through errors.Is; its message says which
// value is wrong and why. A device buffer already freed and a stream
// already destroyed are refused with one that also matches
// cuda.ErrInvalidHandle.
type ArgError struct {
	// List is the list at fault (its index among Copy's lists), or -1 when
	// the fault is not a list's (New's context, Copy's ctx, a Copier not
	// made by New).
	List int
	// Block is the block at fault within the list, or -1 when the fault is
	// not one block's (the list's stream, its length).
	Block int
	msg   string
	err   error // the cause, where package cuda gave one
}

// Error describes the refusal.
func (e *ArgError) Error() string {
	switch {
	case e.List < 0:
		return "blocks: " + e.msg
	case e.Block < 0:
		return fmt.Sprintf("blocks: list %d: %s", e.List, e.msg)
	}
	return fmt.Sprintf("blocks: list %d, block %d: %s", e.List, e.Block, e.msg)
}

// Is reports whether target is cuda.ErrInvalidValue, or matches the
// cause package cuda gave (cuda.ErrInvalidHandle for a freed device
// buffer or a destroyed stream).
func (e *ArgError) Is(target error) bool {
	return target == cuda.ErrInvalidValue || (e.err != nil && errors.Is(e.err, target))
}

func argErr(list, block int, format string, args ...any) *ArgError {
	return &ArgError{List: list, Block: block, msg: fmt.Sprintf(format, args...)}
}

// argCause is the *ArgError of an argument package cuda refused with err.
func argCause(list, block int, what string, err error) *ArgError {
	return &ArgError{List: list, Block: block, msg: what + ": " + err.Error(), err: err}
}

// Option configures New.
type Option func(*options)

type options struct {
	strategy  Strategy
	maxBlocks int // kernel: table capacity; 0: no kernel
}

// WithStrategy makes every Copy use s instead of Auto. Kernel needs
// WithKernel too; New refuses it without, and a Strategy other than the
// constants.
func WithStrategy(s Strategy) Option { return func(o *options) { o.strategy = s } }

// WithKernel loads the gather/scatter kernel into the Copier's context
// with descriptor tables of maxBlocks entries in pinned, mapped host
// memory, and makes Auto take it for blocks under 256 KiB on average whose
// host memory is mapped (see Auto). A list's descriptors are its blocks, one
// more for each boundary a block's host memory crosses between pinned
// ranges that do not map to one device range (pinmem's Mapped buffers
// always map to one). On an H200 the kernel was the fastest strategy at
// every block size from 16 to 256 KiB, one way. It runs on the SMs beside
// the caller's kernels. Its 4 tables, 24 x maxBlocks bytes each (384 KiB
// for 4096 blocks), are pinned (cuMemHostAlloc, mapped, outside pinmem's
// budget) by the first Copy that launches the kernel, not by New, and
// held until Close. WithKernel(0) loads no kernel;
// New refuses a negative maxBlocks and one above 1<<26.
func WithKernel(maxBlocks int) Option { return func(o *options) { o.maxBlocks = maxBlocks } }

// maxKernelBlocks bounds WithKernel: the tables of 1<<26 blocks take 6 GiB.
const maxKernelBlocks = 1 << 26

// Copier copies lists of blocks on the streams of one context. It is safe
// for concurrent use; with a kernel, calls take its tables in turn, each
// waiting for its turn no longer than its context allows. Make one with
// New: the zero Copier refuses every call.
type Copier struct {
	ctx      *cuda.Context
	strategy Strategy
	k        *kernel // nil without WithKernel

	// turn holds a token while a call uses the kernel or Close runs: a
	// channel rather than a mutex, so that the wait for it is bounded by
	// the caller's context.
	turn    chan struct{}
	closing atomic.Bool // Close began: Copy refuses
	closed  bool        // Close released everything; guarded by turn
}

// take waits, bounded by ctx, for the Copier's turn. A free turn is taken
// even when ctx has ended, so that a call with nothing to wait for does
// not fail at random.
func (c *Copier) take(ctx context.Context) error {
	select {
	case c.turn <- struct{}{}:
		return nil
	default:
	}
	select {
	case c.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Copier) give() { <-c.turn }

// usable refuses a nil or zero Copier and a nil ctx.
func (c *Copier) usable(ctx context.Context) error {
	switch {
	case c == nil || c.turn == nil:
		return argErr(-1, -1, "a Copier not made by New")
	case ctx == nil:
		return argErr(-1, -1, "nil context.Context")
	}
	return nil
}

// New returns a Copier for the streams of c. A nil c is an *ArgError; a
// nil option or one with a bad value is a *pinmem.OptionError with Func
// "blocks.New" naming it; both match cuda.ErrInvalidValue. With WithKernel
// New loads the kernel: a driver that cannot load its PTX (ISA 7.0) gives
// an error matching cuda.ErrKernelImage, a device that cannot map host
// memory one matching cuda.ErrNotSupported or the driver's refusal. New
// pins no memory: a Copier holds its kernel's module and events from New,
// and the kernel's tables from the first Copy that launches it, to Close.
func New(c *cuda.Context, opts ...Option) (*Copier, error) {
	if c == nil {
		return nil, argErr(-1, -1, "nil context")
	}
	var o options
	for i, f := range opts {
		if f == nil {
			return nil, &pinmem.OptionError{Func: "blocks.New", Option: "Option", Value: "nil", Reason: fmt.Sprintf("option %d is nil", i)}
		}
		f(&o)
	}
	refuse := func(opt string, v any, reason string) (*Copier, error) {
		return nil, &pinmem.OptionError{Func: "blocks.New", Option: opt, Value: fmt.Sprint(v), Reason: reason}
	}
	switch {
	case o.strategy > Kernel:
		return refuse("WithStrategy", o.strategy, "no such strategy (want Auto, DriverBatch, PerCopy or Kernel)")
	case o.strategy == Kernel && o.maxBlocks == 0:
		return refuse("WithStrategy", o.strategy, "the kernel strategy needs WithKernel")
	case o.maxBlocks < 0 || o.maxBlocks > maxKernelBlocks:
		return refuse("WithKernel", o.maxBlocks, fmt.Sprintf("want 1 to %d blocks", maxKernelBlocks))
	}
	if err := c.Do(func() error { return nil }); err != nil { // a destroyed context
		return nil, err
	}
	bc := &Copier{ctx: c, strategy: o.strategy, turn: make(chan struct{}, 1)}
	if o.maxBlocks > 0 {
		k, err := newKernel(c, o.maxBlocks)
		if err != nil {
			return nil, err
		}
		bc.k = k
	}
	return bc, nil
}

// Close waits, bounded by ctx, for a Copy using the kernel to queue its
// launches and for the kernel's last launches to finish reading its
// tables, and releases the kernel; a Copier without one has
// nothing to wait for. Copy fails after Close. When ctx ends or the
// release fails, Close returns the error and may be called again for what
// is left; a second Close after a successful one returns an error
// matching cuda.ErrInvalidHandle.
func (c *Copier) Close(ctx context.Context) error {
	if err := c.usable(ctx); err != nil {
		return err
	}
	if err := c.take(ctx); err != nil {
		return err
	}
	defer c.give()
	if c.closed {
		return errClosed
	}
	c.closing.Store(true)
	if c.k != nil {
		if err := c.k.close(ctx); err != nil {
			return err
		}
	}
	c.closed = true
	return nil
}

var errClosed = fmt.Errorf("blocks: copier already closed: %w", cuda.ErrInvalidHandle)

// Copy queues the copies of lists, each on its stream, and returns once
// they are queued: a list completes when its stream passes its end (record
// an event there, or synchronize the stream). The copies of one list run
// in no particular order among themselves; a list as a whole is ordered
// after the work queued on its stream before it and before the work
// queued after it. Lists on different streams run at once: a page-out
// (ToHost) and a page-in (ToDevice) on two streams use both directions of
// the link. Their copies are queued in turns, so that neither stream
// waits behind the other's queue.
//
// Copy checks every list before it queues anything and refuses bad input
// with an *ArgError (see the package doc); the one refusing a block of a
// freed device buffer, or a list on a destroyed stream, matches
// cuda.ErrInvalidHandle too. Host blocks must stay alive and
// unchanged until their copies have run. A host block may lie in several
// pinned ranges that follow one another (pinmem registers a buffer over 4
// GiB in chunks): the driver refuses one copy across two registrations,
// so such a block is copied as one copy per range, and the kernel, which
// reaches host memory through device addresses, takes it whole where the
// ranges map to one device range.
//
// With a kernel, Copy may wait, bounded by ctx, for its turn (another
// call's launches, or Close) and for the launch that last read the table
// it takes (four lists back). The first Copy that launches the kernel
// pins its tables (see WithKernel); when the driver refuses, or ctx ends
// before a table is pinned, that Copy returns the error having launched
// nothing, and a later one pins the rest. When the driver fails, or
// ctx ends during that wait, part way through a call, some of its copies
// may be queued: they run in stream order, so wait for the streams before
// reusing the blocks' memory; calling Copy again with the same lists is
// safe.
func (c *Copier) Copy(ctx context.Context, lists ...List) (Report, error) {
	if err := c.usable(ctx); err != nil {
		return Report{}, err
	}
	if err := ctx.Err(); err != nil {
		return Report{}, err
	}
	if c.closing.Load() {
		return Report{}, errClosed
	}
	sc := scratchPool.Get().(*scratch)
	defer sc.put()
	rep, err := c.check(lists, sc)
	if err != nil {
		return Report{}, err
	}
	if rep.Blocks == 0 {
		return rep, nil
	}
	drv, err := cudaerr.Public2(cudadrv.Get())
	if err != nil {
		return Report{}, err
	}
	rep.Strategy = c.choose(drv, lists, rep)
	err = c.ctx.Do(func() error { return c.prepare(drv, lists, sc, &rep) })
	if err == nil && rep.Strategy == Kernel {
		err = c.launch(ctx, lists, sc, &rep)
	}
	runtime.KeepAlive(lists)
	if err != nil {
		return Report{}, err
	}
	return rep, nil
}

// prepare, with the context current, makes the call's pieces for
// rep.Strategy (sc.pinned) and queues them when the copy engines move
// them. Where Auto took the kernel but a host block is not mapped, or a
// list's descriptors (one more per boundary between pinned ranges that
// map apart) overflow the tables, the copy engines move the lists
// instead.
func (c *Copier) prepare(drv cudadrv.Driver, lists []List, sc *scratch, rep *Report) error {
	err := sc.pinned(drv, len(lists), rep.Strategy == Kernel)
	if c.strategy == Auto && rep.Strategy == Kernel && (err != nil && sc.unmapped || err == nil && c.k.overflow(sc, len(lists)) >= 0) {
		rep.Strategy = dmaStrategy(drv, lists, *rep)
		sc.resetPieces(len(lists))
		err = sc.pinned(drv, len(lists), false)
	}
	if err != nil {
		return err
	}
	switch rep.Strategy {
	case DriverBatch:
		return issueBatch(drv, lists, sc, rep)
	case PerCopy:
		return issuePerCopy(drv, lists, sc, rep)
	}
	return nil
}

// launch launches the kernel for the call's pieces under the Copier's
// turn (bounded by ctx), outside Do: cuda makes the context current.
func (c *Copier) launch(ctx context.Context, lists []List, sc *scratch, rep *Report) error {
	if err := c.take(ctx); err != nil {
		return err
	}
	defer c.give()
	if c.closing.Load() {
		return errClosed
	}
	return c.k.issue(ctx, lists, sc, rep)
}

// choose resolves the Copier's strategy for a call of rep.Blocks blocks
// (pick decides Auto).
func (c *Copier) choose(drv cudadrv.Driver, lists []List, rep Report) Strategy {
	if c.strategy != Auto {
		return c.strategy
	}
	fits := c.k != nil
	for _, l := range lists {
		fits = fits && len(l.blocks) <= c.k.cap
	}
	if fits && rep.Bytes/int64(rep.Blocks) < kernelMax {
		return Kernel
	}
	return dmaStrategy(drv, lists, rep)
}

// dmaStrategy is Auto's choice among the copy-engine strategies (pick).
func dmaStrategy(drv cudadrv.Driver, lists []List, rep Report) Strategy {
	_, ok := drv.(cudadrv.BatchCopier)
	batch := ok && cudadrv.BatchCopySymbolOf(drv) != ""
	legacy := false
	for _, l := range lists {
		legacy = legacy || onLegacy(l.s)
	}
	return pick(false, batch, legacy, rep.Bytes/int64(rep.Blocks))
}

// onLegacy reports whether s is the legacy default stream, which the
// driver's batch copy refuses: handle 0, or CU_STREAM_LEGACY (1).
func onLegacy(s *cuda.Stream) bool { return s.Handle() <= 1 }

// pick is Auto's decision for a call whose mean block is mean bytes:
// kernel says the Copier has a kernel and every host block is mapped,
// batch that the driver has the batch copy, legacy that a list is on the
// legacy default stream (which the driver's batch refuses). The figures
// behind it are kernelMax's and batchMax's.
func pick(kernel, batch, legacy bool, mean int64) Strategy {
	switch {
	case kernel && mean < kernelMax:
		return Kernel
	case batch && !legacy && mean <= batchMax:
		return DriverBatch
	}
	return PerCopy
}

// check checks the lists' streams and the device side of their blocks,
// keeps the blocks in sc.blks, orders them by host address and, where a
// copy writes device memory, by device address, and finds bytes that one
// copy writes and another touches. It counts the blocks and bytes.
func (c *Copier) check(lists []List, sc *scratch) (Report, error) {
	var rep Report
	sc.reset(len(lists))
	writesDev := false
	for li, l := range lists {
		if l.s == nil {
			return rep, argErr(li, -1, "nil stream")
		}
		// Contexts compare by handle: a stream or buffer borrowed through
		// another WrapContext of the same context is the copier's.
		if l.s.Context().Handle() != c.ctx.Handle() {
			return rep, argErr(li, -1, "stream of context %#x, the copier's is %#x", l.s.Context().Handle(), c.ctx.Handle())
		}
		if c.strategy == DriverBatch && onLegacy(l.s) {
			return rep, argErr(li, -1, "the driver's batch copy does not take the legacy default stream")
		}
		writesDev = writesDev || !l.toHost
		for i := range l.blocks {
			b := &l.blocks[i]
			n := len(b.Host)
			if n == 0 {
				continue
			}
			if err := c.checkDev(li, i, b); err != nil {
				return rep, err
			}
			h, d := addrOf(b.Host), uint64(b.Dev.Ptr())+uint64(b.Off)
			sc.hb.add(h)
			sc.db.add(d)
			sc.blks = append(sc.blks, blk{h: h, d: d, n: uint64(n), l: int32(li), i: int32(i)})
			rep.Bytes += int64(n)
		}
	}
	rep.Blocks = len(sc.blks)
	// Host order in any case: the pinned check walks it. Device order
	// only where a copy writes device memory.
	sc.hostOrder = sc.sortAddrs(sc.hostOrder, false)
	if err := sc.conflict(lists, sc.hostOrder, false); err != nil {
		return rep, err
	}
	if writesDev {
		sc.devOrder = sc.sortAddrs(sc.devOrder, true)
		if err := sc.conflict(lists, sc.devOrder, true); err != nil {
			return rep, err
		}
	}
	// Stream liveness last: Query is a driver call. A destroyed stream is
	// a refused argument; another failure (a context's sticky error) is
	// the driver's.
	if err := queryStreams(lists); err != nil {
		return rep, err
	}
	return rep, nil
}

// checkDev checks the device side of block i of list li, b, whose host
// side is not empty: a live device buffer of the copier's context that
// holds b's bytes from b.Off.
func (c *Copier) checkDev(li, i int, b *Block) error {
	n := len(b.Host)
	if b.Dev == nil {
		return argErr(li, i, "nil device buffer")
	}
	if err := b.Dev.Err(); err != nil {
		return argCause(li, i, "device buffer", err)
	}
	if b.Dev.Context().Handle() != c.ctx.Handle() {
		return argErr(li, i, "device buffer %#x is of context %#x, the copier's is %#x", uint64(b.Dev.Ptr()), b.Dev.Context().Handle(), c.ctx.Handle())
	}
	if b.Off < 0 || b.Off > b.Dev.Size() || n > b.Dev.Size()-b.Off {
		return argErr(li, i, "[%d,+%d) outside its device buffer of %d bytes", b.Off, n, b.Dev.Size())
	}
	return nil
}

// queryStreams checks that the lists' streams are alive: a destroyed
// stream is a refused argument; another failure of Query (a context's
// sticky error) is the driver's.
func queryStreams(lists []List) error {
	for li, l := range lists {
		if _, err := l.s.Query(); errors.Is(err, cuda.ErrInvalidHandle) {
			return argCause(li, -1, "stream", err)
		} else if err != nil && !errors.Is(err, cuda.ErrNotReady) {
			return fmt.Errorf("blocks: list %d: %w", li, err)
		}
	}
	return nil
}

// conflict returns the error for the first block, in order (sortAddrs'
// keys, by host address or by device address for dev), that shares bytes
// on that side with an earlier one when either of them is written there.
func (sc *scratch) conflict(lists []List, order []uint64, dev bool) error {
	mask := sc.posMask()
	var all, w *blk       // the earlier blocks reaching highest, of all and of the written
	var allHi, wHi uint64 // where they end
	for _, key := range order {
		x := &sc.blks[key&mask]
		lo := x.h
		if dev {
			lo = x.d
		}
		hi := lo + x.n
		written := lists[x.l].toHost != dev // a copy to host writes host memory
		if wHi > lo {
			return overlapErr(x, w, dev)
		}
		if written && allHi > lo {
			return overlapErr(x, all, dev)
		}
		if hi > allHi {
			all, allHi = x, hi
		}
		if written && hi > wHi {
			w, wHi = x, hi
		}
	}
	return nil
}

// overlapErr is the error for block x sharing bytes with the earlier y,
// on the device side for dev, else on the host side.
func overlapErr(x, y *blk, dev bool) *ArgError {
	space, xlo, ylo := "host", x.h, y.h
	if dev {
		space, xlo, ylo = "device", x.d, y.d
	}
	return argErr(int(x.l), int(x.i), "%s memory [%#x,%#x) overlaps block %d of list %d [%#x,%#x), and one of them is a destination (the copies of a call run in no particular order)",
		space, xlo, xlo+x.n, y.i, y.l, ylo, ylo+y.n)
}
