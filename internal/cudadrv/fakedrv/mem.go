package fakedrv

import (
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/cudadrv"
)

const (
	devBase  = 0x7f00_0000_0000
	devAlign = 256
	devGap   = 256 // unallocated bytes between device allocations, so overruns fault
)

// hostRange is pinned host memory: a MemHostAlloc allocation (alloc, mem is
// its mapping) or a MemHostRegister registration.
type hostRange struct {
	base  unsafe.Pointer
	size  uint64
	flags uint32
	alloc bool
	mem   []byte    // the whole mapping, for allocations of their own
	slab  *hostSlab // the shared pinned pages a small allocation lies in; nil for others
	dev   cudadrv.Device
	freed bool
}

func (h *hostRange) start() uintptr { return uintptr(h.base) }
func (h *hostRange) end() uintptr   { return uintptr(h.base) + uintptr(h.size) }

func (h *hostRange) mapped() bool {
	if h.alloc {
		return h.flags&cudadrv.MemHostAllocDeviceMap != 0
	}
	return h.flags&cudadrv.MemHostRegisterDeviceMap != 0
}

// devAlloc is a device allocation.
type devAlloc struct {
	base  cudadrv.DevicePtr
	size  uint64
	mem   []byte // allocated on first touch
	dev   cudadrv.Device
	freed bool
}

// region is memory an operation touches: device memory or pinned host
// memory, at an offset. It is checked again when the operation runs.
type region struct {
	dev  *devAlloc
	host *hostRange
	off  uint64
}

func (r region) bytes(n uint64) ([]byte, error) {
	switch {
	case r.dev != nil:
		if r.dev.freed {
			return nil, errorWhy("", cudadrv.ErrorIllegalAddress, "device memory %#x freed before queued work used it", uint64(r.dev.base))
		}
		if r.dev.mem == nil {
			r.dev.mem = make([]byte, r.dev.size)
		}
		return r.dev.mem[r.off : r.off+n : r.off+n], nil
	case r.host != nil:
		if r.host.freed {
			what := "unregistered"
			if r.host.alloc {
				what = "freed"
			}
			return nil, errorWhy("", cudadrv.ErrorIllegalAddress, "pinned host memory %p %s before queued work used it", r.host.base, what)
		}
		if n == 0 {
			return nil, nil
		}
		return unsafe.Slice((*byte)(unsafe.Add(r.host.base, r.off)), n), nil
	}
	return nil, nil
}

// findHost returns the pinned range containing p, or nil.
func (d *Driver) findHost(p uintptr) *hostRange {
	i := sort.Search(len(d.host), func(i int) bool { return d.host[i].end() > p })
	if i < len(d.host) && d.host[i].start() <= p {
		return d.host[i]
	}
	return nil
}

// overlapsPinned reports whether a byte of [p, p+n) is pinned already: by
// a registration, an allocation or a slab of small allocations (the
// driver's own pinned pages, every byte of them). cuMemHostRegister
// refuses those; memory that only shares a page with a registered range
// it registers (seen on an H100, driver 580: bytes 200-300 of a page whose
// bytes 0-100 were registered).
func (d *Driver) overlapsPinned(p, n uintptr) bool {
	lo, hi := p, p+n
	// Ranges are disjoint and sorted by start, so also by end: the first
	// ending past lo is the only candidate below hi that matters.
	i := sort.Search(len(d.host), func(i int) bool { return d.host[i].end() > lo })
	if i < len(d.host) && d.host[i].start() < hi {
		return true
	}
	for _, sl := range d.slabs {
		if b := uintptr(unsafe.Pointer(&sl.mem[0])); b < hi && lo < b+uintptr(len(sl.mem)) {
			return true
		}
	}
	return false
}

// readOnlyMismatch returns a registration sharing a page with [p, p+n)
// whose read-only flag differs from ro, or nil. The driver refuses the
// second of two such registrations with CUDA_ERROR_INVALID_VALUE (an H100,
// driver 580: read-only after writable and writable after read-only in one
// page; every other pair of flags, portable and device-map among them, was
// registered).
func (d *Driver) readOnlyMismatch(p, n uintptr, ro bool) *hostRange {
	page := uintptr(unix.Getpagesize())
	lo, hi := p&^(page-1), (p+n+page-1)&^(page-1)
	for i := sort.Search(len(d.host), func(i int) bool { return d.host[i].end() > lo }); i < len(d.host) && d.host[i].start() < hi; i++ {
		if h := d.host[i]; !h.alloc && (h.flags&cudadrv.MemHostRegisterReadOnly != 0) != ro {
			return h
		}
	}
	return nil
}

func (d *Driver) insertHost(h *hostRange) {
	i := sort.Search(len(d.host), func(i int) bool { return d.host[i].start() > h.start() })
	d.host = append(d.host, nil)
	copy(d.host[i+1:], d.host[i:])
	d.host[i] = h
}

func (d *Driver) removeHost(h *hostRange) {
	for i, x := range d.host {
		if x == h {
			d.host = append(d.host[:i], d.host[i+1:]...)
			return
		}
	}
}

// findDev returns the device allocation containing p, or nil.
func (d *Driver) findDev(p cudadrv.DevicePtr) *devAlloc {
	i := sort.Search(len(d.dev), func(i int) bool { return uint64(d.dev[i].base)+d.dev[i].size > uint64(p) })
	if i < len(d.dev) && d.dev[i].base <= p {
		return d.dev[i]
	}
	return nil
}

// resolveDev checks that [p, p+n) lies in one device allocation or one
// mapped pinned host range (whose device address is its host address).
func (d *Driver) resolveDev(op string, p cudadrv.DevicePtr, n uint64) (region, error) {
	if a := d.findDev(p); a != nil {
		off := uint64(p - a.base)
		if n > a.size-off {
			return region{}, errorWhy(op, cudadrv.ErrorInvalidValue, "%d bytes at device %#x overrun the allocation of %d bytes at %#x", n, uint64(p), a.size, uint64(a.base))
		}
		return region{dev: a, off: off}, nil
	}
	if h := d.findHost(uintptr(p)); h != nil && h.mapped() {
		off := uint64(uintptr(p) - h.start())
		if n > h.size-off {
			return region{}, errorWhy(op, cudadrv.ErrorInvalidValue, "%d bytes at %#x overrun the mapped host range of %d bytes", n, uint64(p), h.size)
		}
		return region{host: h, off: off}, nil
	}
	return region{}, errorWhy(op, cudadrv.ErrorInvalidValue, "device address %#x is not allocated", uint64(p))
}

// mappedSpan returns the n bytes at p when they lie in live mapped pinned
// ranges that follow one another without a gap (the device address of
// mapped host memory is its host address), for a kernel's access. d.mu
// must be held.
func (d *Driver) mappedSpan(p cudadrv.DevicePtr, n uint64) ([]byte, bool) {
	first := d.findHost(uintptr(p))
	if first == nil || n == 0 {
		return nil, false
	}
	end := uintptr(p) + uintptr(n)
	for h := first; ; {
		if h.freed || !h.mapped() {
			return nil, false
		}
		if h.end() >= end {
			break
		}
		next := d.findHost(h.end())
		if next == nil || next.start() != h.end() {
			return nil, false
		}
		h = next
	}
	return unsafe.Slice((*byte)(unsafe.Add(first.base, uintptr(p)-first.start())), n), true
}

// resolveHost finds the pinned range holding [p, p+n); ok is false for
// pageable memory. A range that starts pinned and runs past the end is an error.
func (d *Driver) resolveHost(op string, p unsafe.Pointer, n uint64) (r region, pinned bool, err error) {
	if p == nil {
		return region{}, false, errorWhy(op, cudadrv.ErrorInvalidValue, "nil host pointer")
	}
	h := d.findHost(uintptr(p))
	if h == nil {
		return region{}, false, nil
	}
	off := uint64(uintptr(p) - h.start())
	if n > h.size-off {
		return region{}, false, errorWhy(op, cudadrv.ErrorInvalidValue, "%d bytes at %p overrun the pinned range of %d bytes at %p", n, p, h.size, h.base)
	}
	return region{host: h, off: off}, true, nil
}

func mmap(n uint64) ([]byte, error) {
	page := uint64(unix.Getpagesize())
	return unix.Mmap(-1, 0, int((n+page-1)/page*page), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
}

func munmap(b []byte) error { return unix.Munmap(b) }

// The driver serves small cuMemHostAlloc requests from pages it pinned
// already: on an H100 (driver 580), two allocations of 12 bytes came back
// 512 bytes apart in one page, and a 128 KiB one shared pages with them.
// The fake does the same, so that code which takes an allocation for whole
// pages of its own fails on the fake as it does on the GPU: requests of up
// to hostSubMax bytes are placed first-fit, at hostSubUnit granularity, in
// slabs of hostSlabSize pinned bytes, each mapped on first need and
// unmapped when its last allocation is freed. Larger requests get a
// mapping of their own, page-aligned.
const (
	hostSubUnit  = 512
	hostSubMax   = 256 << 10
	hostSlabSize = 2 << 20
)

// hostSlab is pinned memory the fake driver sub-allocates small
// allocations from.
type hostSlab struct {
	mem  []byte
	used [hostSlabSize / hostSubUnit]bool
	live int // allocations in it
}

// take reserves n units first-fit and returns the offset of the first, or -1.
func (sl *hostSlab) take(n int) int {
	run := 0
	for i, u := range sl.used {
		if u {
			run = 0
			continue
		}
		if run++; run == n {
			first := i - n + 1
			for j := first; j <= i; j++ {
				sl.used[j] = true
			}
			sl.live++
			return first * hostSubUnit
		}
	}
	return -1
}

// subAlloc places a small allocation of size bytes in a slab. d.mu must be held.
func (d *Driver) subAlloc(size uint64) (unsafe.Pointer, *hostSlab, error) {
	units := int((size + hostSubUnit - 1) / hostSubUnit)
	for _, sl := range d.slabs {
		if off := sl.take(units); off >= 0 {
			return unsafe.Pointer(&sl.mem[off]), sl, nil
		}
	}
	mem, err := mmap(hostSlabSize)
	if err != nil {
		return nil, nil, err
	}
	sl := &hostSlab{mem: mem}
	d.slabs = append(d.slabs, sl)
	off := sl.take(units)
	return unsafe.Pointer(&sl.mem[off]), sl, nil
}

// subFree releases h's units in its slab, and the slab when it is empty. d.mu must be held.
func (d *Driver) subFree(h *hostRange) error {
	sl := h.slab
	first := int(uintptr(h.base)-uintptr(unsafe.Pointer(&sl.mem[0]))) / hostSubUnit
	for j := first; j < first+int((h.size+hostSubUnit-1)/hostSubUnit); j++ {
		sl.used[j] = false
	}
	if sl.live--; sl.live > 0 {
		return nil
	}
	for i, x := range d.slabs {
		if x == sl {
			d.slabs = append(d.slabs[:i], d.slabs[i+1:]...)
			break
		}
	}
	return munmap(sl.mem)
}

// MemHostAlloc is cuMemHostAlloc: it maps anonymous memory (not Go heap)
// of at least size bytes, page-aligned, or for a small request places it
// in pages shared with other small allocations, 512-byte aligned (see
// hostSubMax).
func (d *Driver) MemHostAlloc(size uint64, flags uint32) (unsafe.Pointer, error) {
	const op = "cuMemHostAlloc"
	if _, err := d.begin(op); err != nil {
		return nil, err
	}
	if size == 0 || size > 1<<46 {
		return nil, errorWhy(op, cudadrv.ErrorInvalidValue, "size %d", size)
	}
	if flags&^uint32(0x7) != 0 {
		return nil, errorWhy(op, cudadrv.ErrorInvalidValue, "flags %#x", flags)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, dev, err := d.needCtx(op)
	if err != nil {
		return nil, err
	}
	if d.hostAllocLimit != 0 && d.hostAllocBytes+size > d.hostAllocLimit {
		return nil, errorWhy(op, cudadrv.ErrorOutOfMemory, "%d bytes requested, %d of the limit %d in use", size, d.hostAllocBytes, d.hostAllocLimit)
	}
	h := &hostRange{size: size, flags: flags, alloc: true, dev: dev}
	if size <= hostSubMax {
		if h.base, h.slab, err = d.subAlloc(size); err != nil {
			return nil, errorWhy(op, cudadrv.ErrorOutOfMemory, "mmap %d bytes: %v", hostSlabSize, err)
		}
	} else {
		if h.mem, err = mmap(size); err != nil {
			return nil, errorWhy(op, cudadrv.ErrorOutOfMemory, "mmap %d bytes: %v", size, err)
		}
		h.base = unsafe.Pointer(&h.mem[0])
	}
	d.insertHost(h)
	d.hostAllocBytes += size
	return h.base, nil
}

// MemFreeHost is cuMemFreeHost: p must be a pointer MemHostAlloc returned.
func (d *Driver) MemFreeHost(p unsafe.Pointer) error {
	const op = "cuMemFreeHost"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.findHost(uintptr(p))
	if p == nil || h == nil || !h.alloc || h.base != p {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "%p is not the start of a live MemHostAlloc allocation", p)
	}
	d.removeHost(h)
	h.freed = true
	d.hostAllocBytes -= h.size
	var err error
	if h.slab != nil {
		err = d.subFree(h)
	} else {
		err = munmap(h.mem)
	}
	if err != nil {
		return errorWhy(op, cudadrv.ErrorUnknown, "munmap: %v", err)
	}
	return nil
}

// MemHostRegister is cuMemHostRegister_v2. A range with a byte pinned
// already (registered, allocated with MemHostAlloc, or in the pages the
// driver keeps for small allocations) fails with
// CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED; one that only shares a page
// with a registered range is registered, as on the driver, unless one of
// the two is read-only and the other not (CUDA_ERROR_INVALID_VALUE, as on
// the driver); a device without
// AttrHostRegisterSupported (or AttrReadOnlyHostRegisterSupported, for the
// read-only flag) fails with CUDA_ERROR_NOT_SUPPORTED.
func (d *Driver) MemHostRegister(p unsafe.Pointer, size uint64, flags uint32) error {
	const op = "cuMemHostRegister_v2"
	if _, err := d.begin(op); err != nil {
		return err
	}
	if p == nil || size == 0 || size > 1<<47 {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "pointer %p size %d", p, size)
	}
	if flags&^uint32(0xf) != 0 {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "flags %#x", flags)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, dev, err := d.needCtx(op)
	if err != nil {
		return err
	}
	if len(d.devs) > 0 {
		dv := d.devs[dev]
		if dv.attrs[cudadrv.AttrHostRegisterSupported] == 0 {
			return errorWhy(op, cudadrv.ErrorNotSupported, "device lacks host registration")
		}
		if flags&cudadrv.MemHostRegisterReadOnly != 0 && dv.attrs[cudadrv.AttrReadOnlyHostRegisterSupported] == 0 {
			return errorWhy(op, cudadrv.ErrorNotSupported, "device lacks read-only host registration")
		}
	}
	if d.overlapsPinned(uintptr(p), uintptr(size)) {
		return errorWhy(op, cudadrv.ErrorHostMemoryAlreadyRegistered, "[%p, +%d) overlaps pinned memory", p, size)
	}
	if h := d.readOnlyMismatch(uintptr(p), uintptr(size), flags&cudadrv.MemHostRegisterReadOnly != 0); h != nil {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "[%p, +%d) shares a page with the registration at %p, and one of the two is read-only", p, size, h.base)
	}
	if d.regLimit != 0 && d.regBytes+size > d.regLimit {
		return errorWhy(op, cudadrv.ErrorOutOfMemory, "%d bytes requested, %d of the limit %d registered", size, d.regBytes, d.regLimit)
	}
	d.insertHost(&hostRange{base: p, size: size, flags: flags, dev: dev})
	d.regBytes += size
	return nil
}

// MemHostUnregister is cuMemHostUnregister: p must be the start of a
// registered range, else CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED.
func (d *Driver) MemHostUnregister(p unsafe.Pointer) error {
	const op = "cuMemHostUnregister"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.findHost(uintptr(p))
	if p == nil || h == nil || h.alloc || h.base != p {
		return errorWhy(op, cudadrv.ErrorHostMemoryNotRegistered, "%p is not the start of a registered range", p)
	}
	d.removeHost(h)
	h.freed = true
	d.regBytes -= h.size
	return nil
}

// MemHostGetDevicePointer is cuMemHostGetDevicePointer_v2. p may point
// anywhere inside a range allocated with MemHostAllocDeviceMap or registered
// with MemHostRegisterDeviceMap; the device address equals the host address
// (unified addressing). Other pointers, and flags other than 0, are
// CUDA_ERROR_INVALID_VALUE.
func (d *Driver) MemHostGetDevicePointer(p unsafe.Pointer, flags uint32) (cudadrv.DevicePtr, error) {
	const op = "cuMemHostGetDevicePointer_v2"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	if flags != 0 {
		return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "flags %#x must be 0", flags)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, _, err := d.needCtx(op); err != nil {
		return 0, err
	}
	h := d.findHost(uintptr(p))
	if p == nil || h == nil || !h.mapped() {
		return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "%p is not in host memory pinned with the device-map flag", p)
	}
	return cudadrv.DevicePtr(uintptr(p)), nil
}

// MemHostGetFlags is cuMemHostGetFlags: the flags p's MemHostAlloc
// allocation was made with (registered memory is CUDA_ERROR_INVALID_VALUE,
// as documented for the driver).
func (d *Driver) MemHostGetFlags(p unsafe.Pointer) (uint32, error) {
	const op = "cuMemHostGetFlags"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.findHost(uintptr(p))
	if p == nil || h == nil || !h.alloc {
		return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "%p is not in a MemHostAlloc allocation", p)
	}
	return h.flags, nil
}

// PointerGetAttribute is cuPointerGetAttribute for device allocations and
// pinned host memory; other addresses are CUDA_ERROR_INVALID_VALUE.
func (d *Driver) PointerGetAttribute(attr cudadrv.PointerAttribute, p cudadrv.DevicePtr) (uint64, error) {
	const op = "cuPointerGetAttribute"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var (
		memType, start, size, hostPtr, devPtr uint64
		dev                                   cudadrv.Device
		mapped                                bool
	)
	if a := d.findDev(p); a != nil {
		memType, start, size, devPtr, dev, mapped = cudadrv.MemoryTypeDevice, uint64(a.base), a.size, uint64(p), a.dev, true
	} else if h := d.findHost(uintptr(p)); h != nil {
		memType, start, size, hostPtr, dev, mapped = cudadrv.MemoryTypeHost, uint64(h.start()), h.size, uint64(p), h.dev, h.mapped()
		if mapped {
			devPtr = uint64(p)
		}
	} else {
		return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "%#x is neither device memory nor pinned host memory", uint64(p))
	}
	switch attr {
	case cudadrv.PointerAttrContext:
		return uint64(primaryHandle(dev)), nil
	case cudadrv.PointerAttrMemoryType:
		return memType, nil
	case cudadrv.PointerAttrDevicePointer:
		if devPtr == 0 {
			return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "%#x is not mapped to the device", uint64(p))
		}
		return devPtr, nil
	case cudadrv.PointerAttrHostPointer:
		if hostPtr == 0 {
			return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "%#x is device memory", uint64(p))
		}
		return hostPtr, nil
	case cudadrv.PointerAttrIsManaged:
		return 0, nil
	case cudadrv.PointerAttrDeviceOrdinal:
		return uint64(dev), nil
	case cudadrv.PointerAttrRangeStart:
		return start, nil
	case cudadrv.PointerAttrRangeSize:
		return size, nil
	case cudadrv.PointerAttrMapped:
		if mapped {
			return 1, nil
		}
		return 0, nil
	}
	return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "attribute %d not modelled", attr)
}

// MemAlloc is cuMemAlloc_v2 on the current device.
func (d *Driver) MemAlloc(size uint64) (cudadrv.DevicePtr, error) {
	const op = "cuMemAlloc_v2"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "size 0")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.devs) == 0 {
		return 0, errorWhy(op, cudadrv.ErrorNoDevice, "no devices")
	}
	_, dev, err := d.needCtx(op)
	if err != nil {
		return 0, err
	}
	dv := d.devs[dev]
	if size > dv.limit || dv.used+size > dv.limit {
		return 0, errorWhy(op, cudadrv.ErrorOutOfMemory, "%d bytes requested, %d of %d in use on device %d", size, dv.used, dv.limit, dev)
	}
	a := &devAlloc{base: cudadrv.DevicePtr(d.nextDev), size: size, dev: dev}
	d.nextDev = (d.nextDev + size + devGap + devAlign - 1) &^ (devAlign - 1)
	d.dev = append(d.dev, a) // addresses only grow: the slice stays sorted
	dv.used += size
	return a.base, nil
}

// MemFree is cuMemFree_v2: p must be a pointer MemAlloc returned. Queued
// work that touches the memory afterwards fails when it runs.
func (d *Driver) MemFree(p cudadrv.DevicePtr) error {
	const op = "cuMemFree_v2"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.findDev(p)
	if a == nil || a.base != p {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "%#x is not the start of a live device allocation", uint64(p))
	}
	for i, x := range d.dev {
		if x == a {
			d.dev = append(d.dev[:i], d.dev[i+1:]...)
			break
		}
	}
	a.freed = true
	a.mem = nil
	d.devs[a.dev].used -= a.size
	return nil
}

// DeviceBytes returns a copy of n bytes of device memory (or mapped host
// memory) at p, for tests to inspect; it does not wait for queued work.
func (d *Driver) DeviceBytes(p cudadrv.DevicePtr, n uint64) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, err := d.resolveDev("DeviceBytes", p, n)
	if err != nil {
		return nil, err
	}
	b, err := r.bytes(n)
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), b...), nil
}

// ---- copies and memsets ----

// memsetOp builds the work of a memset of n elements of width bytes.
func memsetWork(op string, r region, n, width uint64, v uint32) func() error {
	return func() error {
		b, err := r.bytes(n * width)
		if err != nil {
			return relabel(err, op)
		}
		if width == 1 {
			for i := range b {
				b[i] = byte(v)
			}
			return nil
		}
		for i := uint64(0); i < n; i++ {
			b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		}
		return nil
	}
}

func relabel(err error, op string) error {
	if e, ok := err.(*cudadrv.Error); ok && e.Op == "" {
		e.Op = op
	}
	return err
}

func copyWork(op string, dst, src region, n uint64) func() error {
	return func() error {
		s, err := src.bytes(n)
		if err != nil {
			return relabel(err, op)
		}
		t, err := dst.bytes(n)
		if err != nil {
			return relabel(err, op)
		}
		copy(t, s)
		return nil
	}
}

// pageable wraps unpinned host memory the caller guarantees for the call.
func pageable(p unsafe.Pointer, n uint64) region {
	return region{host: &hostRange{base: p, size: n}}
}

func (d *Driver) memset(op string, p cudadrv.DevicePtr, v uint32, n, width uint64, s cudadrv.Stream, async bool) error {
	fail, err := d.begin(op)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.refund(&fail)
	if n > 1<<60 {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "count %d", n)
	}
	if width == 4 && p%4 != 0 {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "%#x is not 4-byte aligned", uint64(p))
	}
	r, err := d.resolveDev(op, p, n*width)
	if err != nil {
		return err
	}
	st, err := d.streamOf(op, s)
	if err != nil {
		return err
	}
	fail.r = nil
	o := d.enqueue(st, op, fail, memsetWork(op, r, n, width, v))
	if async {
		return nil
	}
	return d.waitOp(op, o)
}

// MemsetD8 is cuMemsetD8_v2 (synchronous, on the legacy default stream).
func (d *Driver) MemsetD8(p cudadrv.DevicePtr, v byte, n uint64) error {
	return d.memset("cuMemsetD8_v2", p, uint32(v), n, 1, 0, false)
}

// MemsetD8Async is cuMemsetD8Async.
func (d *Driver) MemsetD8Async(p cudadrv.DevicePtr, v byte, n uint64, s cudadrv.Stream) error {
	return d.memset("cuMemsetD8Async", p, uint32(v), n, 1, s, true)
}

// MemsetD32 is cuMemsetD32_v2: n 32-bit words at a 4-byte aligned p.
func (d *Driver) MemsetD32(p cudadrv.DevicePtr, v uint32, n uint64) error {
	return d.memset("cuMemsetD32_v2", p, v, n, 4, 0, false)
}

// copyKind says which sides of a copy are host memory.
type copyKind int

const (
	htod copyKind = iota
	dtoh
	dtod
)

func (d *Driver) memcpy(op string, kind copyKind, dstD, srcD cudadrv.DevicePtr, dstH, srcH unsafe.Pointer, n uint64, s cudadrv.Stream, async bool) error {
	fail, err := d.begin(op)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.refund(&fail)
	st, err := d.streamOf(op, s)
	if err != nil {
		return err
	}
	var dst, src region
	waitDone := !async
	switch kind {
	case htod, dtod:
		if dst, err = d.resolveDev(op, dstD, n); err != nil {
			return err
		}
	case dtoh:
		var pinned bool
		if dst, pinned, err = d.resolveHost(op, dstH, n); err != nil {
			return err
		}
		if !pinned {
			dst = pageable(dstH, n)
			if async {
				d.pageable++
				waitDone = true // the driver returns only once a copy to pageable memory is done
			}
		}
	}
	switch kind {
	case dtoh, dtod:
		if src, err = d.resolveDev(op, srcD, n); err != nil {
			return err
		}
	case htod:
		var pinned bool
		if src, pinned, err = d.resolveHost(op, srcH, n); err != nil {
			return err
		}
		if !pinned {
			if async {
				// The driver stages pageable sources before returning.
				d.pageable++
				staged := make([]byte, n)
				copy(staged, unsafe.Slice((*byte)(srcH), n))
				src = pageable(unsafe.Pointer(unsafe.SliceData(staged)), n)
			} else {
				src = pageable(srcH, n)
			}
		}
	}
	fail.r = nil
	o := d.enqueue(st, op, fail, copyWork(op, dst, src, n))
	if !waitDone {
		return nil
	}
	return d.waitOp(op, o)
}

// MemcpyHtoD is cuMemcpyHtoD_v2 (synchronous, on the legacy default stream).
func (d *Driver) MemcpyHtoD(dst cudadrv.DevicePtr, src unsafe.Pointer, n uint64) error {
	return d.memcpy("cuMemcpyHtoD_v2", htod, dst, 0, nil, src, n, 0, false)
}

// MemcpyDtoH is cuMemcpyDtoH_v2 (synchronous, on the legacy default stream).
func (d *Driver) MemcpyDtoH(dst unsafe.Pointer, src cudadrv.DevicePtr, n uint64) error {
	return d.memcpy("cuMemcpyDtoH_v2", dtoh, 0, src, dst, nil, n, 0, false)
}

// MemcpyDtoD is cuMemcpyDtoD_v2 (synchronous, on the legacy default stream).
func (d *Driver) MemcpyDtoD(dst, src cudadrv.DevicePtr, n uint64) error {
	return d.memcpy("cuMemcpyDtoD_v2", dtod, dst, src, nil, nil, n, 0, false)
}

// MemcpyHtoDAsync is cuMemcpyHtoDAsync_v2. A pageable source is staged
// before the call returns.
func (d *Driver) MemcpyHtoDAsync(dst cudadrv.DevicePtr, src unsafe.Pointer, n uint64, s cudadrv.Stream) error {
	return d.memcpy("cuMemcpyHtoDAsync_v2", htod, dst, 0, nil, src, n, s, true)
}

// MemcpyDtoHAsync is cuMemcpyDtoHAsync_v2. With a pageable destination it
// returns only after the copy ran (blocking while the stream is held).
func (d *Driver) MemcpyDtoHAsync(dst unsafe.Pointer, src cudadrv.DevicePtr, n uint64, s cudadrv.Stream) error {
	return d.memcpy("cuMemcpyDtoHAsync_v2", dtoh, 0, src, dst, nil, n, s, true)
}

// MemcpyDtoDAsync is cuMemcpyDtoDAsync_v2.
func (d *Driver) MemcpyDtoDAsync(dst, src cudadrv.DevicePtr, n uint64, s cudadrv.Stream) error {
	return d.memcpy("cuMemcpyDtoDAsync_v2", dtod, dst, src, nil, nil, n, s, true)
}
