package pinmem

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/lifecycle"
	"github.com/pinmem/pinmem/internal/testhook"
	"github.com/pinmem/pinmem/internal/track"
)

// MaxSize is the largest buffer Alloc and Register accept (256 TiB); larger
// requests are refused with cuda.ErrInvalidValue before any driver call.
const MaxSize = 1 << 48

// hugePageSize is the transparent huge page size pinmem aligns its mappings to.
const hugePageSize = 2 << 20

// regChunk bounds the bytes pinned by one cuMemHostRegister call: one call
// pinning hundreds of GB stalls other processes' CUDA calls. It is 4 GiB so
// that buffers up to 4 GiB are one registration (one segment, see
// Buffer.Segments: a driver copy must not span two registrations) and are
// pinned by one call: splitting a registration over threads does not make
// it faster. A variable so that tests can use small chunks.
var regChunk uintptr = 4 << 30

// Some kernels cap a single pin at 2 GB. A chunk larger than regSplitAbove
// whose registration fails with CUDA_ERROR_INVALID_VALUE or
// CUDA_ERROR_OUT_OF_MEMORY is registered again as pieces of regSplitChunk
// bytes, and so is the rest of that buffer. Variables for tests.
var (
	regSplitAbove uintptr = 2 << 30
	regSplitChunk uintptr = 1 << 30
)

var pageSize = uintptr(os.Getpagesize())

func roundUp(n, to uintptr) uintptr { return (n + to - 1) / to * to }

// Alloc returns size bytes of pinned host memory with the given flags, in
// the primary context of the device (WithDevice, default device 0). The
// memory is zeroed for pinmem's own mappings; cuMemHostAlloc memory is as
// the driver returns it (normally zeroed pages, not guaranteed).
//
// Errors, all before any driver call unless said otherwise: a nil option
// or one with a bad value is an *OptionError with Func "pinmem.Alloc"
// naming it; a size <= 0 or above MaxSize, unknown flags, or flags that
// contradict each other or the method (ReadOnly with MethodHostAlloc,
// WriteCombined with MethodMmapRegister or ReadOnly) match
// cuda.ErrInvalidValue, as an *OptionError does; flags or a method
// the device cannot serve (Mapped without CanMapHostMemory, ReadOnly or
// MethodMmapRegister without host registration support) match
// cuda.ErrNotSupported; a request over the budget is a *BudgetError; an
// allocation failure of the driver or the host is an *OutOfMemoryError.
func Alloc(size int, flags Flags, opts ...Option) (*Buffer, error) {
	o, err := buildOptions("pinmem.Alloc", opts)
	var b *Buffer
	if err == nil {
		b, err = alloc(size, flags, o)
	}
	if err != nil {
		ledgerFailed()
		return nil, err
	}
	return b, nil
}

func checkSize(op string, size int) error {
	if size <= 0 || size > MaxSize {
		return fmt.Errorf("pinmem: %s of %d bytes (want 1..%d): %w", op, size, int64(MaxSize), cuda.ErrInvalidValue)
	}
	return nil
}

func checkDeviceFlags(t target, flags Flags, register bool) error {
	if flags&Mapped != 0 && !t.caps.canMap {
		return fmt.Errorf("pinmem: %v cannot map host memory (CanMapHostMemory=0), so Mapped is impossible: %w", t.dev, cuda.ErrNotSupported)
	}
	if register && !t.caps.hostRegister {
		return fmt.Errorf("pinmem: %v does not support registering host memory (HostRegisterSupported=0; integrated GPUs: use Alloc, which uses cuMemHostAlloc there): %w", t.dev, cuda.ErrNotSupported)
	}
	if flags&ReadOnly != 0 && !t.caps.readOnlyReg {
		return fmt.Errorf("pinmem: %v does not support read-only registration (ReadOnlyHostRegisterSupported=0): %w", t.dev, cuda.ErrNotSupported)
	}
	return nil
}

// alloc checks the request, resolves the device and pins size bytes by
// the method o asks for or, for MethodAuto, the one autoMethod chooses.
func alloc(size int, flags Flags, o options) (*Buffer, error) {
	if err := checkAllocRequest(size, flags, Method(o.Method)); err != nil {
		return nil, err
	}
	t, err := resolve(o)
	if err != nil {
		return nil, err
	}
	method := Method(o.Method)
	if method == MethodAuto {
		method, flags = autoMethod(t, size, flags)
	}
	if err := checkDeviceFlags(t, flags, method == MethodMmapRegister); err != nil {
		return nil, err
	}
	if method == MethodMmapRegister && !mmapSupported {
		return nil, fmt.Errorf("pinmem: ReadOnly needs registration, implemented only on Linux: %w", cuda.ErrNotSupported)
	}
	if method == MethodHostAlloc {
		return allocHost(t, size, flags)
	}
	return allocMmap(t, size, flags, o)
}

// checkAllocRequest refuses what no device could serve: a size out of
// range, unknown flags, and flags that contradict each other or method.
// It needs no driver, so Alloc runs it before resolving the device.
func checkAllocRequest(size int, flags Flags, method Method) error {
	if err := checkSize("Alloc", size); err != nil {
		return err
	}
	if flags&^allFlags != 0 {
		return fmt.Errorf("pinmem: Alloc with unknown flags %#x: %w", uint32(flags&^allFlags), cuda.ErrInvalidValue)
	}
	if flags&WriteCombined != 0 && flags&ReadOnly != 0 {
		return fmt.Errorf("pinmem: Alloc with %s: write-combined memory comes from cuMemHostAlloc, read-only from registration: %w", flags, cuda.ErrInvalidValue)
	}
	switch method {
	case MethodAuto:
	case MethodHostAlloc:
		if flags&ReadOnly != 0 {
			return fmt.Errorf("pinmem: Alloc with ReadOnly and MethodHostAlloc: ReadOnly is a registration flag: %w", cuda.ErrInvalidValue)
		}
	case MethodMmapRegister:
		if flags&WriteCombined != 0 {
			return fmt.Errorf("pinmem: Alloc with WriteCombined and MethodMmapRegister: write-combined memory only comes from cuMemHostAlloc: %w", cuda.ErrInvalidValue)
		}
		if !mmapSupported {
			return fmt.Errorf("pinmem: MethodMmapRegister on %s: %w", runtime.GOOS, cuda.ErrNotSupported)
		}
	}
	return nil
}

// autoMethod chooses MethodAuto's method for size bytes with flags on
// target t, and returns the flags to pin with: the flags that need one
// method get it, integrated GPUs get cuMemHostAlloc memory (Mapped where
// the device can map it), and otherwise buffers of AutoMmapThreshold bytes
// or more are mapped and registered where the platform and device allow.
func autoMethod(t target, size int, flags Flags) (Method, Flags) {
	switch {
	case flags&ReadOnly != 0:
		return MethodMmapRegister, flags
	case flags&WriteCombined != 0:
		return MethodHostAlloc, flags
	case t.caps.integrated:
		// Host and device share memory: mapped memory avoids copies altogether.
		if t.caps.canMap {
			flags |= Mapped
		}
		return MethodHostAlloc, flags
	case !mmapSupported || !t.caps.hostRegister || size < AutoMmapThreshold:
		return MethodHostAlloc, flags
	}
	return MethodMmapRegister, flags
}

func allocHost(t target, size int, flags Flags) (*Buffer, error) {
	n := int64(size)
	limit, before, err := reserve(n)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	var p hostptr.Ptr
	err = t.do(func() (err error) {
		p, err = t.drv.MemHostAlloc(uint64(size), flags.hostAllocFlags())
		if err == nil {
			track.Add(track.HostAlloc, uint64(uintptr(p)), n)
		}
		return err
	})
	if err != nil {
		unreserve(n)
		return nil, driverErr("cuMemHostAlloc", fmt.Sprintf("flags %s", flags), err, n, before, limit)
	}
	// The driver's bytes, not whole pages: it places small allocations side
	// by side in pages it pinned already.
	lo := uintptr(p)
	if err := regInsert(lo, lo+uintptr(size), false); err != nil {
		// Only possible if the driver returned memory pinmem thinks is pinned already.
		_ = t.do(func() error { track.Remove(track.HostAlloc, uint64(lo)); return t.drv.MemFreeHost(p) })
		unreserve(n)
		return nil, err
	}
	s := &bufState{t: t, ptr: p, size: size, pinned: n, kind: KindHostAlloc, flags: flags,
		regLo: lo, regHi: lo + uintptr(size)}
	ledgerAdd(s.kind, flags, n, time.Since(start))
	return newBuffer(s), nil
}

func allocMmap(t target, size int, flags Flags, o options) (*Buffer, error) {
	length := roundUp(uintptr(size), pageSize)
	n := int64(length)
	limit, before, err := reserve(n)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	huge := thpAvailable()
	if o.Huge != nil {
		huge = *o.Huge && huge
	}
	p, hugeOn, err := mapAnon(length, huge)
	if err != nil {
		unreserve(n)
		if isENOMEM(err) {
			return nil, &OutOfMemoryError{Op: "mmap", Requested: n, Pinned: before, Limit: limit, Err: err}
		}
		return nil, fmt.Errorf("pinmem: %w", err)
	}
	placed := placeMapping(t, p, length, o) // before any page is touched
	mapped := time.Since(start)
	touch(p, length, o.Threads, hugeOn)
	touched := time.Since(start)
	var chunks []chunk
	err = t.do(func() (err error) {
		chunks, err = registerChunks(t, p, length, flags)
		return err
	})
	if h := pinPhasesHook; h != nil && err == nil {
		h(mapped, touched, time.Since(start))
	}
	// undo releases a mapping whose pin failed; what the driver still holds
	// (left) keeps the mapping mapped and counted.
	undo := func(left []chunk) {
		if len(left) > 0 {
			keepOrphan(&bufState{t: t, ptr: p, size: size, kind: KindMmapRegister, flags: flags,
				huge: hugeOn, mapLen: length, chunks: left, numa: placed}, n)
			return
		}
		_ = unmapAnon(p, length)
		unreserve(n)
	}
	if err != nil {
		undo(chunks)
		return nil, driverErr("cuMemHostRegister", fmt.Sprintf("flags %s, mmap", flags), err, n, before, limit)
	}
	lo := uintptr(p)
	if err := regInsert(lo, lo+uintptr(size), flags&ReadOnly != 0); err != nil {
		var left []chunk
		uerr := t.do(func() (err error) { left, err = unregisterChunks(t, chunks); return err })
		undo(left)
		return nil, errors.Join(err, uerr)
	}
	s := &bufState{t: t, ptr: p, size: size, pinned: n, kind: KindMmapRegister, flags: flags,
		huge: hugeOn, mapLen: length, chunks: chunks, regLo: lo, regHi: lo + uintptr(size), numa: placed}
	ledgerAdd(s.kind, flags, n, time.Since(start))
	return newBuffer(s), nil
}

// pinPhasesHook, nil except in benchmarks, receives the times from the
// start of a successful allocMmap at which the mapping (and NUMA placement)
// was done, its pages were touched, and it was registered.
var pinPhasesHook func(mapped, touched, registered time.Duration)

// driverErr wraps a failed pin: out-of-memory failures become an
// *OutOfMemoryError with the budget figures.
func driverErr(op, what string, err error, n, before, limit int64) error {
	if errors.Is(err, cuda.ErrOutOfMemory) {
		return &OutOfMemoryError{Op: op, Requested: n, Pinned: before, Limit: limit, Err: err}
	}
	return fmt.Errorf("pinmem: %s of %s (%s): %w", op, fmtBytes(n), what, err)
}

// touch faults in the pages of [p, p+length) by writing a zero to each,
// spread over up to threads goroutines that each take one contiguous share
// of the range (as the C reference of the method does; claiming smaller
// units in turn made no steady difference), and returns when every page is
// touched. With huge pages one write per 2 MiB suffices; where the kernel
// fell back to small pages after all, the untouched pages are faulted in
// by cuMemHostRegister itself (slower, still correct).
func touch(p hostptr.Ptr, length uintptr, threads int, huge bool) {
	if length == 0 {
		return
	}
	step := pageSize
	if huge {
		step = hugePageSize
	}
	mem := hostptr.BytesAt(p, length)
	const minPer = 16 << 20 // below this per goroutine, spawning costs more than it saves
	threads = max(1, min(threads, int(length/minPer)))
	unit := roundUp(length/uintptr(threads), hugePageSize)
	units := int64((length + unit - 1) / unit)
	var next atomic.Int64 // the next unit to claim
	var wg sync.WaitGroup
	for range threads {
		wg.Go(func() {
			for {
				u := next.Add(1) - 1
				if u >= units {
					return
				}
				lo := uintptr(u) * unit
				hi := min(lo+unit, length)
				for i := lo; i < hi; i += step {
					mem[i] = 0
				}
				if step > pageSize {
					// The tail beyond the last full huge page is made of small pages.
					for i := max(lo, hi/hugePageSize*hugePageSize); i < hi; i += pageSize {
						mem[i] = 0
					}
				}
			}
		})
	}
	wg.Wait()
}

// registerChunks registers [p, p+length) in chunks of at most regChunk
// bytes. A chunk above regSplitAbove that the driver refuses with
// CUDA_ERROR_INVALID_VALUE or CUDA_ERROR_OUT_OF_MEMORY (a kernel that caps a
// single pin) is retried as pieces of regSplitChunk bytes, as is every
// later chunk of the range. It runs with the context current. On failure it
// unregisters what it registered and returns the chunks whose
// unregistration failed too (the driver still holds them). For Mapped memory the chunks must map to
// one contiguous device range (true where the device uses the host pointer
// for registered memory); where they do not, the range is registered again
// in one call.
func registerChunks(t target, p hostptr.Ptr, length uintptr, flags Flags) ([]chunk, error) {
	rf := flags.registerFlags()
	var chunks []chunk
	fail := func(err error) ([]chunk, error) {
		left, uerr := unregisterChunks(t, chunks)
		return left, errors.Join(err, uerr)
	}
	step := regChunk
	for off := uintptr(0); off < length; {
		c := chunk{p: hostptr.Offset(p, off), n: chunkLen(p, off, step, length)}
		err := t.drv.MemHostRegister(c.p, uint64(c.n), rf)
		if err != nil && c.n > regSplitAbove && regSplitChunk < c.n &&
			(errors.Is(err, cuda.ErrInvalidValue) || errors.Is(err, cuda.ErrOutOfMemory)) {
			// Perhaps a cap on a single pin: go on in smaller pieces.
			first := fmt.Errorf("chunk at offset %d of %d bytes (%s in one call): %w", off, length, fmtBytes(int64(c.n)), err)
			step = regSplitChunk
			for end := off + c.n; off < end; {
				pc := chunk{p: hostptr.Offset(p, off), n: chunkLen(p, off, step, end)}
				if err := t.drv.MemHostRegister(pc.p, uint64(pc.n), rf); err != nil {
					return fail(errors.Join(first, fmt.Errorf("retried as pieces of %s: piece at offset %d: %w", fmtBytes(int64(step)), off, err)))
				}
				track.Add(track.Registration, uint64(uintptr(pc.p)), int64(pc.n))
				chunks = append(chunks, pc)
				off += pc.n
			}
			continue
		}
		if err != nil {
			return fail(fmt.Errorf("chunk at offset %d of %d bytes: %w", off, length, err))
		}
		track.Add(track.Registration, uint64(uintptr(c.p)), int64(c.n))
		chunks = append(chunks, c)
		off += c.n
	}
	if flags&Mapped == 0 || len(chunks) < 2 {
		return chunks, nil
	}
	contiguous := true
	base, err := t.drv.MemHostGetDevicePointer(p, 0)
	for i := 1; err == nil && i < len(chunks); i++ {
		var dp cudadrv.DevicePtr
		dp, err = t.drv.MemHostGetDevicePointer(chunks[i].p, 0)
		contiguous = contiguous && dp == base+cudadrv.DevicePtr(uintptr(chunks[i].p)-uintptr(p))
	}
	if err == nil && contiguous {
		return chunks, nil
	}
	if left, uerr := unregisterChunks(t, chunks); uerr != nil {
		return left, uerr
	}
	if err := t.drv.MemHostRegister(p, uint64(length), rf); err != nil {
		return nil, fmt.Errorf("mapped range of %d bytes in one call: %w", length, err)
	}
	track.Add(track.Registration, uint64(uintptr(p)), int64(length))
	return []chunk{{p: p, n: length}}, nil
}

// chunkLen is the length of the registration at offset off of the range
// at p that ends at offset end: step bytes, cut back to a page boundary of
// the address space, or the rest when no more than step is left, so that
// no page is registered twice by two chunks of one buffer.
func chunkLen(p hostptr.Ptr, off, step, end uintptr) uintptr {
	if end-off <= step {
		return end - off
	}
	a := uintptr(p) + off
	if n := (a+step)&^(pageSize-1) - a; n > 0 {
		return n
	}
	return min(roundUp(a+1, pageSize)-a, end-off) // step is below a page
}

// unregisterChunks unregisters every chunk, in reverse order, and returns
// the chunks the driver refused to unregister (it still holds them) and the
// errors joined. It runs with the context current.
func unregisterChunks(t target, chunks []chunk) (left []chunk, err error) {
	var errs []error
	for i := len(chunks) - 1; i >= 0; i-- {
		c := chunks[i]
		if err := t.drv.MemHostUnregister(c.p); err != nil {
			errs = append(errs, fmt.Errorf("pinmem: cuMemHostUnregister of %#x: %w", uintptr(c.p), err))
			left = append(left, c)
			continue
		}
		track.Remove(track.Registration, uint64(uintptr(c.p)))
	}
	slices.Reverse(left)
	return left, errors.Join(errs...)
}

// keepOrphan keeps what a failed pin could not undo: registrations the
// driver still holds (s.chunks) because their cleanup unregistration failed
// too. The state stays reachable (with a Go slice's runtime.Pinner, which
// must not be unpinned while the driver holds the slice) and is accounted
// for as a buffer dropped without Free: the ledger and the budget count
// what the driver holds, of the reserved bytes given.
func keepOrphan(s *bufState, reserved int64) {
	var held int64
	for _, c := range s.chunks {
		held += int64(c.n)
	}
	s.pinned = min(held, reserved)
	s.freed.Store(true)
	unreserve(reserved - s.pinned)
	ledgerOrphan(s.kind, s.flags, s.pinned)
	lifecycle.Keep(s)
	ledgerDropped()
	if l := track.Logger(); l != nil {
		l.Warn("pinmem: a failed pin could not be undone; its registrations stay pinned",
			"kind", s.kind.String(), "addr", fmt.Sprintf("%#x", uintptr(s.ptr)), "bytes", s.pinned)
	}
}

// Register page-locks mem in place with cuMemHostRegister (in chunks of at
// most 4 GiB per call; see Buffer.Segments) in the device's primary
// context, and keeps it alive and unmovable with a runtime.Pinner until Free. Free unregisters and
// unpins; it never frees mem. mem must not be pinned by pinmem already: a
// range that shares a byte with a buffer pinmem pinned is an *OverlapError
// (one that only shares a page is registered, as the driver does), and the driver's own CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
// (memory registered by other code) is returned as it is; both match
// cuda.ErrAlreadyRegistered.
//
// Flags may be Portable, Mapped and ReadOnly; WriteCombined is refused with
// cuda.ErrInvalidValue. An empty mem is cuda.ErrInvalidValue; a device that cannot
// register host memory gives cuda.ErrNotSupported. Options are checked as
// for Alloc (an *OptionError with Func "pinmem.Register") and the budget
// applies as for Alloc.
func Register(mem []byte, flags Flags, opts ...Option) (*Buffer, error) {
	o, err := buildOptions("pinmem.Register", opts)
	var b *Buffer
	if err == nil {
		b, err = register(mem, flags, o)
	}
	if err != nil {
		ledgerFailed()
		return nil, err
	}
	return b, nil
}

func register(mem []byte, flags Flags, o options) (*Buffer, error) {
	if err := checkSize("Register", len(mem)); err != nil {
		return nil, err
	}
	if flags&^allFlags != 0 {
		return nil, fmt.Errorf("pinmem: Register with unknown flags %#x: %w", uint32(flags&^allFlags), cuda.ErrInvalidValue)
	}
	if flags&WriteCombined != 0 {
		return nil, fmt.Errorf("pinmem: Register with WriteCombined: write-combined memory only comes from cuMemHostAlloc: %w", cuda.ErrInvalidValue)
	}
	p := hostptr.PtrOf(mem)
	lo, hi := uintptr(p), uintptr(p)+uintptr(len(mem))
	if err := regInsert(lo, hi, flags&ReadOnly != 0); err != nil {
		return nil, err
	}
	b, err := registerClaimed(mem, p, lo, hi, flags, o)
	if err != nil {
		if h := registerFailedHook; h != nil {
			h()
		}
		regRemove(lo)
		// mem must stay alive until its claim is withdrawn: were it
		// collected before, the allocator could hand its address to another
		// slice, whose Register would then fail with a spurious
		// OverlapError.
		runtime.KeepAlive(mem)
		return nil, err
	}
	return b, nil
}

// registerFailedHook, nil except in tests, runs when Register failed with
// its range still claimed.
var registerFailedHook func()

func registerClaimed(mem []byte, p hostptr.Ptr, lo, hi uintptr, flags Flags, o options) (*Buffer, error) {
	t, err := resolve(o)
	if err != nil {
		return nil, err
	}
	if err := checkDeviceFlags(t, flags, true); err != nil {
		return nil, err
	}
	n := int64(len(mem))
	limit, before, err := reserve(n)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	pinner := new(runtime.Pinner)
	pinner.Pin(p)
	var chunks []chunk
	err = t.do(func() (err error) {
		chunks, err = registerChunks(t, p, uintptr(len(mem)), flags)
		return err
	})
	if err != nil {
		if len(chunks) > 0 {
			// The driver still holds part of the slice: it stays pinned.
			keepOrphan(&bufState{t: t, ptr: p, size: len(mem), kind: KindGoRegister, flags: flags,
				chunks: chunks, mem: mem, pinner: pinner}, n)
		} else {
			pinner.Unpin()
			unreserve(n)
		}
		return nil, driverErr("cuMemHostRegister", fmt.Sprintf("flags %s, Go slice at %#x", flags, uintptr(p)), err, n, before, limit)
	}
	s := &bufState{t: t, ptr: p, size: len(mem), pinned: n, kind: KindGoRegister, flags: flags,
		chunks: chunks, mem: mem, pinner: pinner, regLo: lo, regHi: hi}
	ledgerAdd(s.kind, flags, n, time.Since(start))
	return newBuffer(s), nil
}

func init() {
	testhook.SetRegChunk = func(n uintptr) func() {
		old := regChunk
		regChunk = n
		return func() { regChunk = old }
	}
}
