package pinmem

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/lifecycle"
	"github.com/pinmem/pinmem/internal/track"
)

// chunk is one cuMemHostRegister call's range.
type chunk struct {
	p hostptr.Ptr
	n uintptr
}

// bufState is everything needed to release a buffer. It is separate from
// Buffer so that the drop cleanup, which receives it, does not keep the
// Buffer reachable.
type bufState struct {
	// freed is set by the first Free: from then on the memory must not be
	// used, and the buffer's methods fail with ErrFreed. The memory is
	// released when released is set (under relMu), which a failed Free
	// leaves unset, so that Free can be retried.
	freed    atomic.Bool
	relMu    sync.Mutex
	released bool
	held     []chunk // registered kinds: the registrations the driver still holds (nil: all of chunks)
	heldInit bool
	unpinned int64 // bytes of pinned already credited to the ledger and the budget

	t      target
	ptr    hostptr.Ptr
	size   int
	pinned int64 // bytes handed to the driver (ledger and budget)
	kind   Kind
	flags  Flags
	huge   bool       // huge pages were requested and accepted (mmap only)
	numa   *Placement // NUMA placement of pinmem's own mapping; nil: none attempted (numa.go)

	mapLen uintptr     // KindMmapRegister: the mapping's length
	shared *sharedFile // AllocShared and ReceiveShared buffers: the memory's file (share.go)
	chunks []chunk     // registered kinds: the registrations
	mem    []byte      // KindGoRegister: the caller's slice
	pinner *runtime.Pinner
	regLo  uintptr // the registry range [regLo, regHi), the buffer's bytes; regLo 0 if none
	regHi  uintptr

	self weak.Pointer[Buffer] // the Buffer, for Lookup; nil once it is dropped

	dpMu sync.Mutex
	dp   cuda.DevicePtr
	dpOK bool
}

// Buffer is pinned host memory: from cuMemHostAlloc, from pinmem's own
// mapping registered with cuMemHostRegister, or a caller's Go slice
// registered in place. Its methods are safe for concurrent use; Free must be
// called after all use (including asynchronous copies) ended, and called
// again if it failed.
type Buffer struct {
	s       *bufState
	cleanup runtime.Cleanup
}

func (b *Buffer) live() (*bufState, error) {
	if b == nil || b.s == nil {
		return nil, fmt.Errorf("pinmem: nil buffer: %w", cuda.ErrInvalidValue)
	}
	if b.s.freed.Load() {
		return nil, fmt.Errorf("pinmem: %s buffer at %#x (%d bytes): %w", b.s.kind, uintptr(b.s.ptr), b.s.size, ErrFreed)
	}
	return b.s, nil
}

// Bytes returns the buffer's memory, or nil after Free. The slice must not
// be used after Free.
//
// A buffer larger than one registration (more than 4 GiB registered with
// cuMemHostRegister, or less on a kernel that caps a single pin) is several
// registrations: one driver copy over the whole of Bytes then fails. Copy
// such a buffer segment by segment (see Segments).
func (b *Buffer) Bytes() []byte {
	s, err := b.live()
	if err != nil {
		return nil
	}
	return s.bytes()
}

func (s *bufState) bytes() []byte {
	if s.mem != nil {
		return s.mem
	}
	return hostptr.BytesAt(s.ptr, uintptr(s.size))
}

// Segments returns the buffer's memory split at the boundaries of its
// registrations, in order: concatenated they are Bytes. A cuMemHostAlloc
// buffer, and a registered buffer pinned by one cuMemHostRegister call
// (every one up to 4 GiB, unless the kernel caps a single pin lower), is one
// segment; larger registered buffers are registered in chunks of at most 4
// GiB (the bound on one driver call) and have one segment per chunk. Each
// segment's capacity ends at its end, so appending to one never writes into
// the next. It returns nil after Free.
//
// One driver copy (cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, ...) must not span
// two segments: the driver treats each registration as its own pinned range
// and refuses an asynchronous copy whose host range crosses from one into
// the next. With driver 580 (CUDA 13.0) such a cuMemcpyHtoDAsync fails with
// CUDA_ERROR_INVALID_VALUE, which package cuda returns as a *cuda.Error
// matching cuda.ErrInvalidValue, and nothing is copied (the stream stays
// usable); do not rely on either direction working. Copies within one
// segment run at full pinned speed, so a caller copying a whole buffer
// issues one copy per segment (at the matching device offsets), and one
// that copies arbitrary ranges splits them at segment boundaries.
func (b *Buffer) Segments() [][]byte {
	s, err := b.live()
	if err != nil {
		return nil
	}
	mem := s.bytes()
	if len(s.chunks) < 2 {
		return [][]byte{mem[:len(mem):len(mem)]}
	}
	segs := make([][]byte, 0, len(s.chunks))
	for _, c := range s.chunks {
		lo := uintptr(c.p) - uintptr(s.ptr)
		if lo >= uintptr(len(mem)) {
			break // the page-rounding tail of a mapping, beyond Len
		}
		hi := min(lo+c.n, uintptr(len(mem)))
		segs = append(segs, mem[lo:hi:hi])
	}
	return segs
}

// Len returns the buffer's size in bytes (as requested; 0 after Free).
func (b *Buffer) Len() int {
	s, err := b.live()
	if err != nil {
		return 0
	}
	return s.size
}

// Pinned returns the bytes the buffer holds page-locked now, as counted by
// the ledger and the budget: Len rounded up to whole pages for pinmem's own
// mappings, Len otherwise (a small cuMemHostAlloc buffer shares pages the
// driver pinned with its neighbours; it counts its own bytes); 0 once Free
// has released the memory. After a
// Free that failed it is what the driver still holds (non-zero: Free must
// be retried).
func (b *Buffer) Pinned() int64 {
	if b == nil || b.s == nil {
		return 0
	}
	s := b.s
	s.relMu.Lock()
	defer s.relMu.Unlock()
	if s.released {
		return 0
	}
	return s.pinned - s.unpinned
}

// Flags returns the flags in effect. They may include more than were asked
// for: MethodAuto adds Mapped on integrated GPUs.
func (b *Buffer) Flags() Flags {
	if b == nil || b.s == nil {
		return 0
	}
	return b.s.flags
}

// Device returns the device whose primary context pinned the memory.
func (b *Buffer) Device() *cuda.Device {
	if b == nil || b.s == nil {
		return nil
	}
	return b.s.t.dev
}

// String describes the buffer.
func (b *Buffer) String() string {
	if b == nil || b.s == nil {
		return "pinmem.Buffer(nil)"
	}
	st := ""
	if b.s.freed.Load() {
		st = ", freed"
	}
	return fmt.Sprintf("pinmem.Buffer(%s, %s, %d bytes at %#x%s)", b.s.kind, b.s.flags, b.s.size, uintptr(b.s.ptr), st)
}

// DevicePtr returns the device address of a Mapped buffer
// (cuMemHostGetDevicePointer), for kernels that read and write host memory
// directly. It fails with ErrNotMapped for a buffer without Mapped and with
// ErrFreed after Free.
func (b *Buffer) DevicePtr() (cuda.DevicePtr, error) {
	s, err := b.live()
	if err != nil {
		return 0, err
	}
	if s.flags&Mapped == 0 {
		return 0, fmt.Errorf("pinmem: %s buffer at %#x has flags %s, not mapped: %w", s.kind, uintptr(s.ptr), s.flags, ErrNotMapped)
	}
	s.dpMu.Lock()
	defer s.dpMu.Unlock()
	if s.dpOK {
		return s.dp, nil
	}
	var dp cudadrv.DevicePtr
	err = s.t.do(func() (err error) {
		dp, err = s.t.drv.MemHostGetDevicePointer(s.ptr, 0)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("pinmem: device pointer of %s buffer at %#x: %w", s.kind, uintptr(s.ptr), err)
	}
	s.dp, s.dpOK = cuda.DevicePtr(dp), true
	return s.dp, nil
}

// Free releases the memory: cuMemFreeHost, or cuMemHostUnregister of each
// registered chunk followed by munmap (pinmem's mappings) or by unpinning
// the Go slice (Register; the slice itself is never freed). It must be
// called after every use of the memory (asynchronous copies and kernels
// included) has finished; from the first call on, the buffer's other
// methods fail with ErrFreed.
//
// When the driver or munmap fails, Free returns the error and the buffer
// stays allocated as far as the driver still holds it: the ledger and the
// budget keep counting what is still pinned (registrations that were
// released are credited), a registered Go slice stays pinned, and calling
// Free again retries what is left. A buffer dropped after a failed Free is
// reported and counted as dropped, like one never freed. Once Free has
// succeeded, a further call returns an error matching ErrFreed. A buffer
// registered with package remote's Agent has that registration dropped
// first; while a transfer uses it, Free is refused (remote.ErrBusy) and
// changes nothing.
func (b *Buffer) Free() error {
	if b == nil || b.s == nil {
		return fmt.Errorf("pinmem: Free of a nil buffer: %w", cuda.ErrInvalidValue)
	}
	s := b.s
	if err := runFreeHooks(s); err != nil {
		return err
	}
	s.freed.Store(true)
	s.relMu.Lock()
	defer s.relMu.Unlock()
	if s.released {
		return fmt.Errorf("pinmem: Free of %s buffer at %#x (%d bytes) again: %w", s.kind, uintptr(s.ptr), s.size, ErrFreed)
	}
	if err := s.release(); err != nil {
		return err
	}
	b.cleanup.Stop()
	return nil
}

// release releases what the driver and the kernel still hold of the
// buffer and accounts for it. The caller holds relMu and has checked that
// released is unset. Nothing is credited before the driver call that
// releases it has succeeded; on failure what is still held stays counted
// and a later call retries it.
func (s *bufState) release() error {
	start := time.Now()
	// Forget the range first: once the driver or munmap releases it, the
	// address may be handed out again at once, to another goroutine. It is
	// claimed again if the release fails (the driver still holds it, so no
	// one else can have been given it).
	if s.regLo != 0 {
		regRemove(s.regLo)
	}
	var err error
	switch s.kind {
	case KindHostAlloc:
		err = s.t.do(func() error { return s.t.drv.MemFreeHost(s.ptr) })
		if err != nil {
			err = fmt.Errorf("pinmem: cuMemFreeHost of %#x: %w", uintptr(s.ptr), err)
			break
		}
		track.Remove(track.HostAlloc, uint64(uintptr(s.ptr)))
		s.credit(s.pinned - s.unpinned)
	case KindMmapRegister, KindGoRegister:
		if err = s.unregister(); err != nil {
			break
		}
		if s.kind == KindMmapRegister {
			// Only now: unmapping memory the driver still pins would leave
			// pinned pages without an owner.
			err = unmapAnon(s.ptr, s.mapLen)
			if err == nil {
				s.shared.close()
			}
		} else {
			// The driver no longer holds the slice: it may move and be freed.
			s.pinner.Unpin()
		}
	}
	if err != nil {
		if s.regLo != 0 {
			_ = regInsertState(s.regLo, s.regHi, s.flags&ReadOnly != 0, s)
		}
		return err
	}
	s.released = true
	ledgerReleased(s.kind, s.flags, time.Since(start))
	return nil
}

// unregister unregisters the registrations still held, in reverse order,
// crediting each one that the driver released, and returns the errors
// joined. The ones that failed stay held for a retry.
func (s *bufState) unregister() error {
	if !s.heldInit {
		s.held, s.heldInit = slices.Clone(s.chunks), true
	}
	var errs []error
	err := s.t.do(func() error {
		for i := len(s.held) - 1; i >= 0; i-- {
			c := s.held[i]
			if err := s.t.drv.MemHostUnregister(c.p); err != nil {
				errs = append(errs, fmt.Errorf("pinmem: cuMemHostUnregister of %#x: %w", uintptr(c.p), err))
				continue
			}
			track.Remove(track.Registration, uint64(uintptr(c.p)))
			s.held = slices.Delete(s.held, i, i+1)
			s.credit(int64(c.n))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(s.held) == 0 {
		// Whatever was pinned beyond the chunks (none today) is released too.
		s.credit(s.pinned - s.unpinned)
	}
	return errors.Join(errs...)
}

// credit gives n released bytes back to the ledger and the budget.
func (s *bufState) credit(n int64) {
	n = min(n, s.pinned-s.unpinned)
	if n <= 0 {
		return
	}
	s.unpinned += n
	ledgerUnpinned(s.kind, s.flags, n)
	unreserve(n)
}

// SetLogger sets the process-wide logger through which pinmem reports, at
// warning level, a Buffer that became unreachable without Free and an
// owner of driver resources (a transfer.Copier, Pipeline or Multi, a
// pool.Pool) that became unreachable without Close, and returns the
// previous logger. The default is nil: reports are silent. Silent or not,
// every such drop is counted in Stats (LedgerStats.Dropped and
// LedgerStats.DroppedOwners).
func SetLogger(l *slog.Logger) (prev *slog.Logger) { return track.SetLogger(l) }

// onDrop runs when a Buffer became unreachable. It never frees: the GPU
// may still be using the memory.
func onDrop(s *bufState) {
	s.relMu.Lock()
	released := s.released
	s.relMu.Unlock()
	if released {
		return
	}
	// Its memory is still pinned, and a registered Go slice's
	// runtime.Pinner must not become unreachable while it pins (the
	// garbage collector aborts the process on a leaked pinned pointer).
	lifecycle.Keep(s)
	ledgerDropped()
	l := track.Logger()
	if l == nil {
		return
	}
	tk := track.HostAlloc
	if s.kind != KindHostAlloc {
		tk = track.Registration
	}
	attrs := []any{"kind", s.kind.String(), "addr", fmt.Sprintf("%#x", uintptr(s.ptr)), "bytes", s.size, "flags", s.flags.String()}
	for _, o := range track.Live() {
		if o.Kind == tk && o.ID == uint64(uintptr(s.ptr)) && o.Stack != "" {
			attrs = append(attrs, "allocated_at", o.Stack)
			break
		}
	}
	l.Warn("pinmem: buffer became unreachable without Free; it stays pinned", attrs...)
}

func newBuffer(s *bufState) *Buffer {
	b := &Buffer{s: s}
	b.cleanup = runtime.AddCleanup(b, onDrop, s)
	s.self = weak.Make(b)
	if s.regLo != 0 {
		regBind(s)
	}
	return b
}

// View returns the buffer's memory as a slice of T. T must hold no Go
// pointers (the garbage collector does not scan pinned memory), and the
// buffer's length and address must fit T's size and alignment; otherwise
// the error matches cuda.ErrInvalidValue. After Free it matches ErrFreed.
func View[T any](b *Buffer) ([]T, error) {
	s, err := b.live()
	if err != nil {
		return nil, err
	}
	size, align := hostptr.SizeAlign[T]()
	typ := reflect.TypeFor[T]()
	if size == 0 {
		return nil, fmt.Errorf("pinmem: View as zero-size type %v: %w", typ, cuda.ErrInvalidValue)
	}
	if hasPointers(typ) {
		return nil, fmt.Errorf("pinmem: View as %v, which holds Go pointers: %w", typ, cuda.ErrInvalidValue)
	}
	p := s.ptr
	if uintptr(s.size)%size != 0 {
		return nil, fmt.Errorf("pinmem: View as %v: buffer of %d bytes is not a multiple of %d: %w", typ, s.size, size, cuda.ErrInvalidValue)
	}
	if uintptr(p)%align != 0 {
		return nil, fmt.Errorf("pinmem: View as %v: address %#x is not %d-byte aligned: %w", typ, uintptr(p), align, cuda.ErrInvalidValue)
	}
	return hostptr.SliceAt[T](p, uintptr(s.size)/size), nil
}

// hasPointers reports whether values of t contain pointers the garbage collector must see.
func hasPointers(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Array:
		return t.Len() > 0 && hasPointers(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if hasPointers(t.Field(i).Type) {
				return true
			}
		}
		return false
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.String, reflect.Interface,
		reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return true
	}
	return false
}
