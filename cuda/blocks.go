package cuda

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"slices"
	"sync"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/hostptr"
)

// Block copies: many small copies between host and device memory queued
// as one unit on a stream, for an inference server that pages a KV cache
// in and out block by block. Queuing one driver copy per block costs
// about 1.3-2 us of CPU per block, while a 16 KiB block takes 0.3 us on
// the bus; Stream.CopyBlocks hands the whole list to the driver in one
// call where the driver has cuMemcpyBatchAsync (CUDA 12.8+), and
// otherwise issues one copy per block with one crossing into C per 16
// blocks (as Batch does). A third strategy, asked for with a BlockKernel,
// writes the list into a pinned, mapped table and launches one
// gather/scatter kernel that moves the blocks over mapped host memory
// with the SMs.
//
// It lives in package cuda, beside Stream and DeviceBuffer, because that
// is the only public package that may reach the driver binding (the batch
// entry point, pointer attributes), and because the checks it makes are
// of objects this package owns: device buffers (freed, range, context)
// and streams. Host memory is checked through the driver's pointer
// attributes, so memory pinned by pinmem (Alloc, Register, pool blocks)
// and by other libraries is accepted alike, and any other is refused.

// Direction says which way a block copy moves data.
type Direction uint8

// Directions of a block copy.
const (
	// HostToDevice copies each host block into its device block (page in).
	HostToDevice Direction = iota + 1
	// DeviceToHost copies each device block into its host block (page out).
	DeviceToHost
)

// String returns "HtoD" or "DtoH".
func (d Direction) String() string {
	switch d {
	case HostToDevice:
		return "HtoD"
	case DeviceToHost:
		return "DtoH"
	}
	return fmt.Sprintf("Direction(%d)", uint8(d))
}

// BlockCopy is one block of a block copy: the len(Host) bytes of pinned
// host memory at Host and as many bytes at offset Off of the device
// buffer Dev. A block with an empty Host copies nothing.
type BlockCopy struct {
	Host []byte
	Dev  *DeviceBuffer
	Off  int
}

// BlockStrategy is how CopyBlocks hands the copies to the driver.
type BlockStrategy uint8

// Strategies of CopyBlocks.
const (
	// BlockAuto picks BlockKernelCopy when a kernel is given
	// (WithBlockKernel): on an H200 it was the fastest strategy at every
	// block size measured, 16 KiB to 256 KiB. Without one it picks
	// BlockDriverBatch when the driver has it, the stream is not the
	// legacy default stream and the mean block is at most the batch limit
	// (DefaultBlockBatchMax, or WithBlockBatchMax); otherwise BlockPerCopy.
	BlockAuto BlockStrategy = iota
	// BlockDriverBatch queues all blocks with one cuMemcpyBatchAsync call
	// (cuMemcpyBatchAsync_v2 on CUDA 13). A driver older than 12.8 answers
	// an error matching ErrNotSupported.
	BlockDriverBatch
	// BlockPerCopy queues one cuMemcpyHtoDAsync/DtoHAsync per block, 16
	// per crossing from Go into C (as Batch).
	BlockPerCopy
	// BlockKernelCopy launches pinmem's gather/scatter kernel, which copies the blocks with the SMs over
	// mapped host memory (WithBlockKernel; host blocks must be mapped).
	// It is an opt-in, taken by BlockAuto only when a kernel is given: it
	// runs on the SMs beside the caller's kernels, and it needs the host
	// blocks mapped (pinmem.Mapped) and a BlockKernel loaded in the
	// context.
	BlockKernelCopy
)

// String returns the strategy's name: "auto", "driver-batch", "per-copy" or "kernel".
func (s BlockStrategy) String() string {
	switch s {
	case BlockAuto:
		return "auto"
	case BlockDriverBatch:
		return "driver-batch"
	case BlockPerCopy:
		return "per-copy"
	case BlockKernelCopy:
		return "kernel"
	}
	return fmt.Sprintf("BlockStrategy(%d)", uint8(s))
}

// DefaultBlockBatchMax is the largest mean block size, in bytes, for
// which BlockAuto uses the driver's batch copy. Below it the per-call
// cost of one copy per block (1.3-2 us on an H200 host) is a large share
// of a block's bus time (a 16 KiB block takes 0.3 us, a 256 KiB one about
// 5 us), and one call for all blocks wins. From 1 MiB on (20 us of bus
// time per block) the call cost is under a tenth of the transfer and the
// per-copy path, which every driver has and which lets the copy engines
// start on the first block while later ones are still being queued, is
// as fast. BenchmarkGPUBlocks measures the strategies on a machine;
// WithBlockBatchMax overrides the default.
const DefaultBlockBatchMax = 1 << 20

// Errors of the checks CopyBlocks makes before it queues anything. Each
// comes inside a *BlockError, which also matches ErrInvalidValue.
var (
	// ErrBlockOverlap: two destination blocks share bytes (the copies of
	// one batch run in no particular order, so the result would be undefined).
	ErrBlockOverlap = errors.New("destination blocks overlap")
	// ErrBlockRange: a device block runs past the end of its buffer, or has a negative offset.
	ErrBlockRange = errors.New("block outside its device buffer")
	// ErrHostNotPinned: a host block is not (wholly) pinned host memory:
	// some byte of it, at an end or between pinned ranges, is pageable.
	ErrHostNotPinned = errors.New("host block is not pinned memory")
	// ErrBlockContext: a device block belongs to another context (or
	// device) than the stream, or the event to record (or the block
	// kernel) does.
	ErrBlockContext = errors.New("block of another context than the stream")
	// ErrHostNotMapped: the kernel strategy was asked for, and a host
	// block is pinned but not mapped into the device's address space.
	ErrHostNotMapped = errors.New("host block is not mapped into the device's address space")
	// ErrStagingOverlap: the part of the staging buffer (WithBlockStaging)
	// that the staged blocks need overlaps a host block of the list. The
	// staged bytes would overwrite a source block before its copy ran
	// (HostToDevice), or the copies into the stage would land in a
	// destination block (DeviceToHost).
	ErrStagingOverlap = errors.New("staging buffer overlaps a host block")
)

// ErrStagingInUse is matched by the error of a DeviceToHost CopyBlocks
// with staged blocks (WithBlockStaging) that could not wait for its copies
// into the staging buffer: the device may still write the buffer. Do not
// reuse or free it until a later wait for the stream (Stream.Synchronize,
// Context.Synchronize) succeeds; where none ever does, leak it. The
// driver's error comes with it.
var ErrStagingInUse = errors.New("the device may still write the staging buffer")

// BlockError is a block list CopyBlocks refused before queuing any copy.
// It matches its Reason (ErrBlockOverlap, ErrBlockRange, ErrHostNotPinned,
// ErrHostNotMapped, ErrStagingOverlap, ErrBlockContext) and ErrInvalidValue through errors.Is; a freed device
// buffer is reported with Reason matching ErrInvalidHandle instead.
type BlockError struct {
	// Index is the block at fault.
	Index int
	// Other is the block Index overlaps (ErrBlockOverlap), else -1.
	Other int
	// Reason is one of the sentinels above, or the device buffer's Err.
	Reason error
	// Detail gives the addresses and sizes.
	Detail string
}

// Error describes the refusal.
func (e *BlockError) Error() string {
	if e == nil {
		return "<nil>"
	}
	s := fmt.Sprintf("cuda: block %d", e.Index)
	if e.Other >= 0 {
		s += fmt.Sprintf(" (and block %d)", e.Other)
	}
	s += ": " + e.Reason.Error()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Is matches ErrInvalidValue for the refusals of the checks.
func (e *BlockError) Is(target error) bool {
	if e == nil {
		return false
	}
	return target == ErrInvalidValue && !errors.Is(e.Reason, ErrInvalidHandle)
}

// Unwrap returns Reason.
func (e *BlockError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Reason
}

// BlockReport says how CopyBlocks queued a block list.
type BlockReport struct {
	// Strategy is the one that queued the copies (never BlockAuto).
	Strategy BlockStrategy
	// Blocks is how many blocks were queued (empty ones not counted).
	Blocks int
	// Bytes is how many bytes they hold.
	Bytes int64
	// Calls is how many driver calls queued them: 1 for the driver's
	// batch, one per copy for the per-copy strategy (one per block, and
	// one more for each boundary between two pinned ranges that a block
	// crosses), the launch for the kernel.
	Calls int
	// Staged is how many blocks went through the staging buffer (WithBlockStaging).
	Staged int
}

// BlockOption configures one CopyBlocks call.
type BlockOption func(*blockOptions)

type blockOptions struct {
	strategy BlockStrategy
	batchMax int
	overlap  bool
	event    *Event
	staging  []byte
	kernel   *BlockKernel
}

// WithBlockStrategy chooses the strategy instead of BlockAuto.
func WithBlockStrategy(s BlockStrategy) BlockOption {
	return func(o *blockOptions) { o.strategy = s }
}

// WithBlockBatchMax sets the largest mean block size for which BlockAuto
// picks the driver's batch copy (default DefaultBlockBatchMax; 0 or
// less: never).
func WithBlockBatchMax(n int) BlockOption {
	return func(o *blockOptions) { o.batchMax = n }
}

// WithBlockOverlapCompute sets CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
// on the driver's batch copy: a hint that the copies should run beside
// kernels (on copy engines) rather than as fast as possible. The
// per-copy strategy ignores it.
func WithBlockOverlapCompute(on bool) BlockOption {
	return func(o *blockOptions) { o.overlap = on }
}

// WithBlockEvent records e on the stream after the last copy, so that
// the whole list has one completion to wait on (e.Synchronize, or
// Stream.WaitEvent on another stream). e must belong to the stream's
// context.
func WithBlockEvent(e *Event) BlockOption {
	return func(o *blockOptions) { o.event = e }
}

// WithBlockKernel gives CopyBlocks the kernel strategy's state and, with
// BlockAuto, picks that strategy (BlockKernelCopy); k must belong to the
// stream's context and hold at least as many blocks as the list (a block
// whose host memory lies in pinned ranges that do not map to one device
// range takes one entry per range; pinmem's Mapped buffers always map to
// one).
func WithBlockKernel(k *BlockKernel) BlockOption {
	return func(o *blockOptions) { o.kernel = k }
}

// WithBlockStaging lets CopyBlocks take host blocks that are not pinned:
// they go through buf, which must be pinned and at least as large as
// those blocks together. For HostToDevice their bytes are copied into buf
// before the copies are queued, and buf must not be changed until the
// stream has run them; for DeviceToHost the copies land in buf and
// CopyBlocks waits for the stream and copies them out before it returns,
// so it returns only when the whole list is done. When it fails after
// queuing some of them, it still waits for those (and copies out the
// blocks BlockReport counts as queued) before it returns, so that buf may
// be reused; when that wait fails, the error matches ErrStagingInUse and
// buf must be left alone until a later wait succeeds. The part of buf the
// staged blocks use must not overlap any host block of the list (refused
// with ErrStagingOverlap). Without this option such blocks are refused
// with ErrHostNotPinned.
func WithBlockStaging(buf []byte) BlockOption {
	return func(o *blockOptions) { o.staging = buf }
}

// span is a block's host or device address range, with the block's index.
type span struct {
	lo, hi uint64
	i      int
}

// blockScratch holds the arrays of one CopyBlocks call; they are pooled,
// since a list of thousands of blocks would otherwise allocate hundreds of
// KiB per call.
type blockScratch struct {
	dsts, srcs []cudadrv.DevicePtr
	sizes      []uint64
	dst, host  []span
	ops        []cudadrv.BatchOp
	staged     map[int][]byte // block index -> its part of the staging buffer
	pieces     []piece        // the copies to queue, in block order
	nqueued    int            // how many of pieces the strategy queued (all, or a prefix)
	cuts       []uint64       // hostCheck.cover's answer for one block
	keys       []uint64       // sortSpans' packed sort keys
	keys2      []uint64       // radixSort's second buffer
	tmp        []span         // sortSpans' reordered copy
	tmpPieces  []piece        // inBlockOrder's reordered copy
	counts     []int          // inBlockOrder's pieces per block
}

// piece is one copy of a block list: a whole block, or the part of one
// that lies in one pinned range when the block's host memory spans
// several (one driver copy must not span two registrations: the driver
// refuses it). off is the part's offset both in the block's host memory
// (its own, or its part of the staging buffer: hostOf) and in its device
// block.
type piece struct {
	blk, off, n int
	dev         uint64 // kernel strategy: the device address of the part's host memory
}

func cmpPiece(a, b piece) int {
	if a.blk != b.blk {
		return a.blk - b.blk
	}
	return a.off - b.off
}

// wholeBelow returns the index below which every block is queued whole
// when the first n pieces are: the pieces are in block order, so those are
// the blocks before the block of piece n (a block split into pieces whose
// later part failed is not queued whole).
func (sc *blockScratch) wholeBelow(blocks []BlockCopy, n int) int {
	if n < len(sc.pieces) {
		return sc.pieces[n].blk
	}
	return len(blocks)
}

// queued returns how many blocks the first n pieces queue whole, and
// their bytes.
func (sc *blockScratch) queued(blocks []BlockCopy, n int) (int, int64) {
	limit := sc.wholeBelow(blocks, n)
	count, bytes := 0, int64(0)
	for _, p := range sc.pieces[:n] {
		if p.off == 0 && p.blk < limit { // a block's first piece
			count++
			bytes += int64(len(blocks[p.blk].Host))
		}
	}
	return count, bytes
}

// hostOf returns the host memory block i is copied from or to: its own,
// or its part of the staging buffer.
func (sc *blockScratch) hostOf(blocks []BlockCopy, i int) []byte {
	if p, ok := sc.staged[i]; ok {
		return p
	}
	return blocks[i].Host
}

var scratchPool = sync.Pool{New: func() any { return new(blockScratch) }}

// CopyBlocks queues the copies of blocks in direction dir on s, as one
// unit: they complete when the stream passes the end of the list (record
// an event there with WithBlockEvent, or Synchronize). The copies of the
// list run in no particular order among themselves; the list as a whole
// is ordered after the work queued on s before it and before the work
// queued after it.
//
// Before queuing anything CopyBlocks checks every block and refuses the
// list with a *BlockError (matching ErrInvalidValue) when a device block
// lies outside its buffer (ErrBlockRange), belongs to another context
// than s (ErrBlockContext; with freed buffers matching ErrInvalidHandle),
// a host block is not pinned all through (ErrHostNotPinned; the driver's
// pointer attributes decide, a few queries per pinned range the blocks
// lie in) or, for the kernel strategy, not mapped (ErrHostNotMapped), or
// two destination blocks overlap (ErrBlockOverlap). Host blocks must stay
// alive and untouched until the copies have run. WithBlockStaging takes
// unpinned host blocks through a pinned buffer instead of refusing them.
//
// A host block may lie in several pinned ranges that follow one another
// (pinmem registers a buffer over 4 GiB in chunks, see pinmem.Buffer.Segments):
// the driver refuses one copy across two registrations, so the driver's
// batch and the per-copy strategy copy such a block as one copy per range
// (BlockReport.Calls counts them), and the kernel, which reaches host
// memory through device addresses, takes it whole where the ranges map to
// one device range.
//
// The strategy is BlockAuto's choice (see DefaultBlockBatchMax) unless
// WithBlockStrategy or WithBlockKernel says otherwise; BlockReport says
// which ran. When the driver fails the per-copy strategy part way, the
// blocks before the failing one are queued (BlockReport.Blocks says how
// many) and the error is returned; the driver's batch and the kernel
// queue all or nothing. With staged DeviceToHost blocks, CopyBlocks waits
// for whatever it queued before it returns, also on failure (see
// WithBlockStaging and ErrStagingInUse). BlockAuto falls back to the per-copy strategy
// when the driver lacks the batch copy. It is safe to call from several
// goroutines.
func (s *Stream) CopyBlocks(dir Direction, blocks []BlockCopy, opts ...BlockOption) (BlockReport, error) {
	o := blockOptions{batchMax: DefaultBlockBatchMax}
	for i, f := range opts {
		if f == nil {
			return BlockReport{}, fmt.Errorf("cuda: CopyBlocks option %d is nil: %w", i, ErrInvalidValue)
		}
		f(&o)
	}
	if err := s.usable(); err != nil {
		return BlockReport{}, err
	}
	if dir != HostToDevice && dir != DeviceToHost {
		return BlockReport{}, fmt.Errorf("cuda: CopyBlocks direction %v: %w", dir, ErrInvalidValue)
	}
	if o.strategy > BlockKernelCopy {
		return BlockReport{}, fmt.Errorf("cuda: CopyBlocks strategy %v: %w", o.strategy, ErrInvalidValue)
	}
	if o.kernel != nil && o.strategy == BlockAuto {
		o.strategy = BlockKernelCopy
	}
	if o.strategy == BlockKernelCopy {
		if o.kernel == nil {
			return BlockReport{}, fmt.Errorf("cuda: the kernel strategy needs WithBlockKernel: %w", ErrInvalidValue)
		}
		if o.kernel.ctx != s.ctx {
			return BlockReport{}, &BlockError{Index: -1, Other: -1, Reason: ErrBlockContext, Detail: "the block kernel"}
		}
	}
	if o.event != nil {
		if err := o.event.usable(); err != nil {
			return BlockReport{}, err
		}
		if o.event.ctx != s.ctx {
			return BlockReport{}, &BlockError{Index: -1, Other: -1, Reason: ErrBlockContext, Detail: "the event to record"}
		}
	}
	sc := scratchPool.Get().(*blockScratch)
	defer func() {
		clear(sc.ops) // drop references to host memory before pooling
		sc.staged = nil
		scratchPool.Put(sc)
	}()
	rep, err := s.checkBlocks(dir, blocks, sc)
	if err != nil {
		return BlockReport{}, err
	}
	if rep.Blocks == 0 {
		if o.event != nil {
			return rep, o.event.Record(s)
		}
		return rep, nil
	}

	strategy := o.strategy
	bc, hasBatch := s.ctx.drv.(cudadrv.BatchCopier)
	if strategy == BlockAuto {
		strategy = BlockPerCopy
		if hasBatch && s.h != 0 && cudadrv.BatchCopySymbolOf(s.ctx.drv) != "" && o.batchMax > 0 && rep.Bytes/int64(rep.Blocks) <= int64(o.batchMax) {
			strategy = BlockDriverBatch
		}
	}
	if strategy == BlockDriverBatch && s.h == 0 {
		return BlockReport{}, fmt.Errorf("cuda: the driver's batch copy does not take the legacy default stream: %w", ErrInvalidValue)
	}
	if strategy == BlockDriverBatch && !hasBatch {
		return BlockReport{}, fmt.Errorf("cuda: the driver has no batch copy: %w", ErrNotSupported)
	}

	var stagedOut []stagedBlock
	issued := false // whether the copies were handed to the driver
	err = s.ctx.Do(func() error {
		var err error
		if stagedOut, err = s.pinnedOrStaged(dir, blocks, sc, &o, &rep); err != nil {
			return err
		}
		issued = true
		switch strategy {
		case BlockDriverBatch:
			err = s.issueDriverBatch(bc, dir, blocks, sc, &o, &rep)
		case BlockKernelCopy:
			if err = s.issueKernel(o.kernel, dir, blocks, sc.pieces, &rep); rep.Calls > 0 {
				sc.nqueued = len(sc.pieces) // rep.Calls counts the launch once it is queued, with every piece
			}
		default:
			err = s.issuePerCopy(dir, blocks, sc, &rep)
		}
		if err == nil && o.event != nil {
			err = pub(s.ctx.drv.EventRecord(o.event.h, s.h))
		}
		if len(stagedOut) > 0 && sc.nqueued > 0 {
			// Copies into the staging buffer are queued: wait for them
			// whether or not something failed since, for the caller may
			// reuse or free the stage as soon as CopyBlocks returns. The
			// blocks queued whole are then copied out, as rep says.
			if serr := pub(s.ctx.drv.StreamSynchronize(s.h)); serr != nil {
				// The device may still write the stage: say so, and leave
				// the blocks alone (their bytes may not all have landed).
				return errors.Join(err, fmt.Errorf("cuda: waiting for the copies into the staging buffer: %w: %w", ErrStagingInUse, serr))
			}
			limit := sc.wholeBelow(blocks, sc.nqueued)
			for _, b := range stagedOut {
				if b.blk < limit {
					copy(b.dst, b.from)
				}
			}
		}
		return err
	})
	runtime.KeepAlive(blocks)
	if !issued {
		return BlockReport{}, err
	}
	rep.Strategy = strategy
	return rep, err
}

// stagedBlock is DeviceToHost block blk, which lands in the staging
// buffer (from) and is copied to its host block (dst) once the stream is
// done.
type stagedBlock struct {
	blk       int
	dst, from []byte
}

// checkBlocks checks the device side and the overlaps of the
// destinations, fills sc.dst and sc.host, and counts the blocks and bytes.
func (s *Stream) checkBlocks(dir Direction, blocks []BlockCopy, sc *blockScratch) (BlockReport, error) {
	var rep BlockReport
	sc.dst, sc.host = sc.dst[:0], sc.host[:0]
	for i, b := range blocks {
		n := len(b.Host)
		if n == 0 {
			continue
		}
		if err := b.Dev.Err(); err != nil {
			return rep, &BlockError{Index: i, Other: -1, Reason: err}
		}
		if b.Dev.ctx != s.ctx {
			return rep, &BlockError{Index: i, Other: -1, Reason: ErrBlockContext,
				Detail: fmt.Sprintf("device buffer %#x is of context %#x, the stream's is %#x", uint64(b.Dev.ptr), b.Dev.ctx.Handle(), s.ctx.Handle())}
		}
		if b.Off < 0 || b.Off > b.Dev.size || n > b.Dev.size-b.Off {
			return rep, &BlockError{Index: i, Other: -1, Reason: ErrBlockRange,
				Detail: fmt.Sprintf("[%d,+%d) of a device buffer of %d bytes", b.Off, n, b.Dev.size)}
		}
		d := uint64(b.Dev.ptr) + uint64(b.Off)
		h := uint64(hostptr.AddrOf(b.Host))
		sc.host = append(sc.host, span{h, h + uint64(n), i})
		if dir == HostToDevice {
			sc.dst = append(sc.dst, span{d, d + uint64(n), i})
		}
		rep.Blocks++
		rep.Bytes += int64(n)
	}
	sc.sortSpans(sc.host)
	dst := sc.dst
	if dir == DeviceToHost {
		dst = sc.host
	} else {
		sc.sortSpans(dst)
	}
	for k := 1; k < len(dst); k++ {
		if dst[k].lo < dst[k-1].hi {
			a, b := dst[k-1], dst[k]
			return rep, &BlockError{Index: max(a.i, b.i), Other: min(a.i, b.i), Reason: ErrBlockOverlap,
				Detail: fmt.Sprintf("[%#x,%#x) and [%#x,%#x)", a.lo, a.hi, b.lo, b.hi)}
		}
	}
	return rep, nil
}

// sortSpans sorts sp by address (cmpSpan: spans are listed in block
// order, so equal addresses stay in block order); a list already in order
// (blocks taken in order from one buffer) costs one pass. A shuffled list
// of thousands of blocks (a KV cache's free list) is the case that costs:
// each span becomes one integer key, its address relative to the lowest
// with its position in the low bits, and the keys are sorted as plain
// integers, several times faster than sorting the spans with a comparison
// function. Addresses too far apart for the key fall back to that.
func (sc *blockScratch) sortSpans(sp []span) {
	if slices.IsSortedFunc(sp, cmpSpan) {
		return
	}
	base, top := sp[0].lo, sp[0].lo
	var differ uint64 // the bits in which some address differs from the first
	for _, x := range sp {
		base, top = min(base, x.lo), max(top, x.lo)
		differ |= x.lo ^ sp[0].lo
	}
	// The low bits that no address differs in are the same in every offset
	// from base (blocks of one size): they are left out of the key.
	tz := 0
	if differ != 0 {
		tz = bits.TrailingZeros64(differ)
	}
	ib := bits.Len(uint(len(sp) - 1)) // bits for a position
	kb := bits.Len64((top-base)>>tz) + ib
	if kb > 64 {
		slices.SortFunc(sp, cmpSpan)
		return
	}
	sc.keys = sc.keys[:0]
	for k, x := range sp {
		sc.keys = append(sc.keys, (x.lo-base)>>tz<<ib|uint64(k))
	}
	keys := radixSort(sc.keys, &sc.keys2, kb)
	sc.tmp = append(sc.tmp[:0], sp...)
	mask := uint64(1)<<ib - 1
	for j, key := range keys {
		sp[j] = sc.tmp[key&mask]
	}
}

// radixSort sorts keys, whose values fit in nbits bits, and returns the
// sorted slice: keys itself or *buf (grown to len(keys)), whichever the
// last pass wrote. Short lists are sorted in place by comparison.
func radixSort(keys []uint64, buf *[]uint64, nbits int) []uint64 {
	if len(keys) < 256 {
		slices.Sort(keys)
		return keys
	}
	if cap(*buf) < len(keys) {
		*buf = make([]uint64, len(keys))
	}
	src, dst := keys, (*buf)[:len(keys)]
	for shift := 0; shift < nbits; shift += 8 {
		var count [257]int
		for _, k := range src {
			count[(k>>shift)&0xff+1]++
		}
		for i := 1; i < 257; i++ {
			count[i] += count[i-1]
		}
		for _, k := range src {
			d := (k >> shift) & 0xff
			dst[count[d]] = k
			count[d]++
		}
		src, dst = dst, src
	}
	return src
}

func cmpSpan(a, b span) int {
	switch {
	case a.lo < b.lo:
		return -1
	case a.lo > b.lo:
		return 1
	}
	return a.i - b.i
}

// hostCheck asks the driver about host memory, remembering the last
// pinned range it found so that blocks carved from one buffer cost a few
// queries in all (cover).
type hostCheck struct {
	drv     cudadrv.Driver
	qerr    error // the first failure other than "unknown address"
	noRange bool  // the driver knows pinned blocks but reports no range: stop asking
	known   span  // the last pinned range found
	dev     uint64
	mapped  bool // known's device address is dev
	asked   bool // whether known's device address was asked for
}

// attr reads a pointer attribute. The driver answers
// CUDA_ERROR_INVALID_VALUE for an address it does not know (pageable
// memory): that is a plain false. Any other failure of the queries that
// decide (memory type, device pointer) is kept in qerr; the range
// queries only save work, so their failures count as "no range".
func (c *hostCheck) attr(a cudadrv.PointerAttribute, p uint64) (uint64, bool) {
	v, err := pub2(c.drv.PointerGetAttribute(a, cudadrv.DevicePtr(p)))
	decides := a == cudadrv.PointerAttrMemoryType || a == cudadrv.PointerAttrDevicePointer
	if err != nil && decides && !errors.Is(err, ErrInvalidValue) && c.qerr == nil {
		c.qerr = err
	}
	return v, err == nil
}

func (c *hostCheck) isHost(p uint64) bool {
	t, ok := c.attr(cudadrv.PointerAttrMemoryType, p)
	return ok && t == cudadrv.MemoryTypeHost
}

// cover reports whether [lo, hi) is pinned host memory all through, and
// appends to cuts each address inside it where one pinned range (an
// allocation or a registration) ends and the next begins. It walks the
// driver's ranges from lo, remembering the last one found, so that blocks
// carved from one buffer cost a few queries in all; a block whose two ends
// are pinned with pageable memory between them is not pinned. Where the
// driver reports no range it falls back to probe, which finds a pageable
// gap of a page or more but no boundary between ranges.
func (c *hostCheck) cover(lo, hi uint64, cuts []uint64) ([]uint64, bool) {
	for p := lo; p < hi; {
		if p >= c.known.lo && p < c.known.hi {
			if hi <= c.known.hi {
				return cuts, true
			}
			p = c.known.hi
			cuts = append(cuts, p) // the next range must start right here
			continue
		}
		if c.noRange {
			return cuts, c.probe(p, hi)
		}
		start, ok := c.attr(cudadrv.PointerAttrRangeStart, p)
		var size uint64
		if ok {
			size, ok = c.attr(cudadrv.PointerAttrRangeSize, p)
		}
		if !c.isHost(p) {
			return cuts, false // pageable (or not host memory at all)
		}
		if !ok || start > p || p-start >= size {
			// Pinned, but the driver reports no range holding p: stop asking.
			c.noRange = true
			return cuts, c.probe(p, hi)
		}
		c.known, c.asked = span{start, start + size, 0}, false
	}
	return cuts, true
}

// hostPage is the granularity at which probe asks.
var hostPage = uint64(os.Getpagesize())

// probe reports whether the first and the last byte of [lo, hi), and the
// first byte of every page between them, are pinned host memory: pinning
// is per page, so no pageable page lies inside.
func (c *hostCheck) probe(lo, hi uint64) bool {
	if !c.isHost(lo) {
		return false
	}
	for q := lo - lo%hostPage + hostPage; q < hi; q += hostPage {
		if !c.isHost(q) {
			return false
		}
	}
	return c.isHost(hi - 1)
}

// devAddr returns the device address of pinned host address p, or false
// when the memory is not mapped: from the remembered range's mapping when
// p lies in it, else asked for p alone.
func (c *hostCheck) devAddr(p uint64) (uint64, bool) {
	if p >= c.known.lo && p < c.known.hi {
		if !c.asked {
			c.dev, c.mapped = c.attr(cudadrv.PointerAttrDevicePointer, c.known.lo)
			c.asked = true
		}
		if c.mapped {
			return c.dev + (p - c.known.lo), true
		}
		return 0, false
	}
	return c.attr(cudadrv.PointerAttrDevicePointer, p)
}

// pinnedOrStaged checks, with s's context current, that every host block
// is pinned all through (hostCheck.cover), and for the kernel strategy
// mapped, and makes the list's copies (sc.pieces, in block order): one per
// block, cut where a block's host memory crosses from one pinned range
// into the next (for the kernel, only where the ranges do not map to one
// device range). Blocks that are not pinned are refused, or staged with
// WithBlockStaging: their host side becomes part of the staging buffer
// (sc.staged; HtoD: filled now; DtoH: returned, to be copied out after the
// stream is done).
func (s *Stream) pinnedOrStaged(dir Direction, blocks []BlockCopy, sc *blockScratch, o *blockOptions, rep *BlockReport) ([]stagedBlock, error) {
	c := &hostCheck{drv: s.ctx.drv}
	kernel := o.strategy == BlockKernelCopy
	sc.pieces, sc.nqueued = sc.pieces[:0], 0
	// add appends the pieces of block i, whose host memory (its own or its
	// part of the stage) is [lo, hi), pinned, with range boundaries cuts.
	add := func(i int, lo, hi uint64, cuts []uint64) error {
		for k := 0; k <= len(cuts); k++ {
			plo, phi := lo, hi
			if k > 0 {
				plo = cuts[k-1]
			}
			if k < len(cuts) {
				phi = cuts[k]
			}
			p := piece{blk: i, off: int(plo - lo), n: int(phi - plo)}
			if kernel {
				d, ok := c.devAddr(plo)
				if ok && c.noRange && phi-plo > 1 {
					// No ranges, so no cuts: the last byte must map where the first does.
					last, lok := c.devAddr(phi - 1)
					ok = lok && last == d+(phi-1-plo)
				}
				if !ok {
					if c.qerr != nil {
						return fmt.Errorf("cuda: asking the driver for the device address of host block %d: %w", i, c.qerr)
					}
					return &BlockError{Index: i, Other: -1, Reason: ErrHostNotMapped, Detail: fmt.Sprintf("%d bytes at %#x (allocate it with pinmem.Mapped)", phi-plo, plo)}
				}
				p.dev = d
				// The kernel reaches host memory through device addresses:
				// ranges mapped one after the other need no cut.
				if k > 0 {
					if last := &sc.pieces[len(sc.pieces)-1]; last.dev+uint64(last.n) == d {
						last.n += p.n
						continue
					}
				}
			}
			sc.pieces = append(sc.pieces, p)
		}
		return nil
	}
	var staged []int // indexes into sc.host
	need := 0
	for k, h := range sc.host {
		var ok bool
		sc.cuts, ok = c.cover(h.lo, h.hi, sc.cuts[:0])
		if c.qerr != nil {
			return nil, fmt.Errorf("cuda: asking the driver whether host block %d is pinned: %w", h.i, c.qerr)
		}
		if ok {
			if err := add(h.i, h.lo, h.hi, sc.cuts); err != nil {
				return nil, err
			}
			continue
		}
		if o.staging == nil {
			return nil, &BlockError{Index: h.i, Other: -1, Reason: ErrHostNotPinned,
				Detail: fmt.Sprintf("%d bytes at %#x", h.hi-h.lo, h.lo)}
		}
		staged = append(staged, k)
		need += int(h.hi - h.lo)
	}
	var out []stagedBlock
	if len(staged) > 0 {
		var err error
		if out, err = stage(dir, blocks, sc, o, c, staged, need, add); err != nil {
			return nil, err
		}
		rep.Staged = len(staged)
	}
	// The pieces were made in host address order; they are queued in
	// block order (the per-copy strategy reports a prefix of the list).
	sc.inBlockOrder(len(blocks))
	return out, nil
}

// inBlockOrder puts sc.pieces in block order (cmpPiece) for a list of
// nblk blocks. The pieces of one block were made together, in offset
// order, so a stable counting sort by block does it in linear time.
func (sc *blockScratch) inBlockOrder(nblk int) {
	if slices.IsSortedFunc(sc.pieces, cmpPiece) {
		return
	}
	sc.counts = append(sc.counts[:0], make([]int, nblk+1)...)
	for _, p := range sc.pieces {
		sc.counts[p.blk+1]++
	}
	for i := 1; i <= nblk; i++ {
		sc.counts[i] += sc.counts[i-1]
	}
	sc.tmpPieces = append(sc.tmpPieces[:0], sc.pieces...)
	for _, p := range sc.tmpPieces {
		sc.pieces[sc.counts[p.blk]] = p
		sc.counts[p.blk]++
	}
}

// stage gives the blocks sc.host[k] for k in staged, need bytes in all,
// their parts of the staging buffer, checked first (large enough, apart
// from every host block of the list, pinned), and makes their pieces with
// add, cut at the stage's own range boundaries.
func stage(dir Direction, blocks []BlockCopy, sc *blockScratch, o *blockOptions, c *hostCheck, staged []int, need int, add func(int, uint64, uint64, []uint64) error) ([]stagedBlock, error) {
	if need > len(o.staging) {
		return nil, fmt.Errorf("cuda: %d unpinned host blocks need %d bytes of staging, the staging buffer has %d: %w", len(staged), need, len(o.staging), ErrInvalidValue)
	}
	lo := uint64(hostptr.AddrOf(o.staging))
	// The part of the stage in use must not overlap a block of the list:
	// filling it (HtoD) would overwrite a source before its copy ran, and
	// the copies into it (DtoH) would land in a destination. Host sources
	// may overlap each other, so sc.host is not disjoint: a plain scan.
	hi := lo + uint64(need)
	for _, h := range sc.host {
		if h.lo < hi && lo < h.hi {
			return nil, &BlockError{Index: h.i, Other: -1, Reason: ErrStagingOverlap,
				Detail: fmt.Sprintf("staging [%#x,%#x) and host block [%#x,%#x)", lo, hi, h.lo, h.hi)}
		}
	}
	cuts, ok := c.cover(lo, hi, nil)
	if c.qerr != nil {
		return nil, fmt.Errorf("cuda: asking the driver whether the staging buffer is pinned: %w", c.qerr)
	}
	if !ok {
		return nil, &BlockError{Index: -1, Other: -1, Reason: ErrHostNotPinned, Detail: "the staging buffer"}
	}
	var out []stagedBlock
	off, ci := 0, 0
	for _, k := range staged {
		h := sc.host[k]
		b := blocks[h.i].Host
		part := o.staging[off : off+len(b)]
		if dir == HostToDevice {
			copy(part, b)
		} else {
			out = append(out, stagedBlock{blk: h.i, dst: b, from: part})
		}
		if sc.staged == nil {
			sc.staged = make(map[int][]byte, len(staged))
		}
		sc.staged[h.i] = part
		a := uint64(hostptr.AddrOf(part))
		e := a + uint64(len(part))
		for ci < len(cuts) && cuts[ci] <= a {
			ci++
		}
		cj := ci
		for cj < len(cuts) && cuts[cj] < e {
			cj++
		}
		if err := add(h.i, a, e, cuts[ci:cj]); err != nil {
			return nil, err
		}
		off += len(b)
	}
	return out, nil
}

// issueDriverBatch queues the blocks with one cuMemcpyBatchAsync.
func (s *Stream) issueDriverBatch(bc cudadrv.BatchCopier, dir Direction, blocks []BlockCopy, sc *blockScratch, o *blockOptions, rep *BlockReport) error {
	sc.dsts, sc.srcs, sc.sizes = sc.dsts[:0], sc.srcs[:0], sc.sizes[:0]
	for _, p := range sc.pieces {
		b := blocks[p.blk]
		d := cudadrv.DevicePtr(uint64(b.Dev.ptr) + uint64(b.Off) + uint64(p.off))
		h := cudadrv.DevicePtr(uint64(hostptr.AddrOf(sc.hostOf(blocks, p.blk))) + uint64(p.off))
		if dir == HostToDevice {
			sc.dsts, sc.srcs = append(sc.dsts, d), append(sc.srcs, h)
		} else {
			sc.dsts, sc.srcs = append(sc.dsts, h), append(sc.srcs, d)
		}
		sc.sizes = append(sc.sizes, uint64(p.n))
	}
	attr := cudadrv.MemcpyAttributes{SrcAccessOrder: cudadrv.MemcpySrcAccessOrderStream}
	if o.overlap {
		attr.Flags = cudadrv.MemcpyFlagPreferOverlapWithCompute
	}
	fail, err := bc.MemcpyBatchAsync(sc.dsts, sc.srcs, sc.sizes, []cudadrv.MemcpyAttributes{attr}, []uint64{0}, s.h)
	err = pub(err)
	rep.Calls = 1
	if err != nil { // a refused batch queues nothing
		n := rep.Blocks
		rep.Blocks, rep.Bytes = 0, 0
		if fail >= 0 && fail < len(sc.pieces) {
			return fmt.Errorf("cuda: batch copy of %d blocks, at block %d: %w", n, sc.pieces[fail].blk, err)
		}
		return fmt.Errorf("cuda: batch copy of %d blocks: %w", n, err)
	}
	sc.nqueued = len(sc.pieces)
	return nil
}

// issuePerCopy queues one driver copy per piece (per block, unless a
// block spans pinned ranges), 16 per crossing into C.
func (s *Stream) issuePerCopy(dir Direction, blocks []BlockCopy, sc *blockScratch, rep *BlockReport) error {
	sc.ops = sc.ops[:0]
	for _, p := range sc.pieces {
		b := blocks[p.blk]
		h := hostptr.PtrOf(sc.hostOf(blocks, p.blk)[p.off:])
		op := cudadrv.BatchOp{Kind: cudadrv.BatchCopyHtoD, Dev: cudadrv.DevicePtr(uint64(b.Dev.ptr) + uint64(b.Off) + uint64(p.off)), Host: h, N: uint64(p.n), Stream: s.h}
		if dir == DeviceToHost {
			op.Kind = cudadrv.BatchCopyDtoH
		}
		sc.ops = append(sc.ops, op)
	}
	n, err := pub2(cudadrv.RunBatch(s.ctx.drv, sc.ops))
	sc.nqueued = n
	rep.Calls = n
	if err != nil {
		rep.Calls++
	}
	rep.Blocks, rep.Bytes = sc.queued(blocks, n)
	if err != nil && n < len(sc.pieces) {
		return fmt.Errorf("cuda: block copy %d of %d (block %d): %w", n, len(sc.ops), sc.pieces[n].blk, err)
	}
	if err != nil {
		return fmt.Errorf("cuda: block copy %d of %d: %w", n, len(sc.ops), err)
	}
	return nil
}
