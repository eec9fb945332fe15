package fakedrv

import (
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/kernels"
)

var _ cudadrv.BatchCopier = (*Driver)(nil)

// BatchCopySymbol is the batch-copy entry point a driver of the fake's
// version has: cuMemcpyBatchAsync_v2 from 13.0 (the default), the 12.8
// form cuMemcpyBatchAsync on 12.8 and 12.9, none before (Options.DriverVersion).
func (d *Driver) BatchCopySymbol() string {
	switch cudadrv.BatchCopySymbol(d.version) {
	case cudadrv.SymMemcpyBatchAsyncV2:
		return "cuMemcpyBatchAsync_v2"
	case cudadrv.SymMemcpyBatchAsyncV1:
		return "cuMemcpyBatchAsync"
	}
	return ""
}

// MemcpyBatchAsync is cuMemcpyBatchAsync_v2, or cuMemcpyBatchAsync when
// the fake's version is 12.8 or 12.9 (calls are counted and faults
// injected under that name); before 12.8 it is a *cudadrv.LoadError
// matching ErrNotSupported, as the binding reports a missing symbol.
//
// It checks what the driver checks: a stream other than the legacy
// default stream (CU_STREAM_PER_THREAD is taken), arrays of one length, attribute indexes that start at 0
// and increase, a valid source access order, and every copy's source and
// destination inside one device allocation (of the stream's device) or
// one pinned host range. A rejected batch queues nothing; failIdx names
// the copy at fault in the 12.8 form and is -1 in the 13.0 form, which
// does not report it. The real driver also accepts pageable host memory;
// the fake does not model that (pinmem never passes it). The accepted
// batch is one operation on the stream: its copies run together, in order.
func (d *Driver) MemcpyBatchAsync(dsts, srcs []cudadrv.DevicePtr, sizes []uint64, attrs []cudadrv.MemcpyAttributes, attrIdxs []uint64, s cudadrv.Stream) (int, error) {
	op := d.BatchCopySymbol()
	if op == "" {
		return -1, &cudadrv.LoadError{Path: "cudatest", Symbol: cudadrv.SymMemcpyBatchAsyncV1, Err: cudadrv.ErrNotSupported}
	}
	d.mu.Lock()
	classes := d.batchClasses(dsts, srcs)
	d.mu.Unlock()
	fail, err := d.begin(op, classes...)
	if err != nil {
		return -1, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.refund(&fail)
	// The driver refuses the legacy default stream (0, CU_STREAM_LEGACY)
	// but takes CU_STREAM_PER_THREAD (2), a real stream to it; the fake
	// runs that one on its single default stream.
	if s <= 1 {
		return -1, errorWhy(op, cudadrv.ErrorInvalidValue, "the legacy default stream (%#x) cannot take a batch copy", uintptr(s))
	}
	st, err := d.streamOf(op, s)
	if err != nil {
		return -1, err
	}
	if err := checkBatchArgs(op, dsts, srcs, sizes, attrs, attrIdxs); err != nil {
		return -1, err
	}
	dev, haveDev := d.ctxDevice(st.ctx)
	work, i, err := d.resolveBatch(op, dsts, srcs, sizes, dev, haveDev)
	if err != nil {
		if op != cudadrv.SymMemcpyBatchAsyncV1 {
			i = -1 // the 13.0 form does not report the copy at fault
		}
		return i, err
	}
	fail.r = nil
	d.enqueue(st, op, fail, func() error {
		for _, w := range work {
			if err := copyWork(op, w.dst, w.src, w.n)(); err != nil {
				return err
			}
		}
		return nil
	})
	return -1, nil
}

// checkBatchArgs checks the shape of a batch copy's arguments as the
// driver does before it looks at any address: non-empty arrays of one
// length, attribute indexes that start at 0, increase and stay below the
// number of copies, and a valid source access order in every attribute.
func checkBatchArgs(op string, dsts, srcs []cudadrv.DevicePtr, sizes []uint64, attrs []cudadrv.MemcpyAttributes, attrIdxs []uint64) error {
	n := len(dsts)
	if n == 0 || len(srcs) != n || len(sizes) != n {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "batch of %d destinations, %d sources, %d sizes", len(dsts), len(srcs), len(sizes))
	}
	if len(attrs) == 0 || len(attrIdxs) != len(attrs) || attrIdxs[0] != 0 {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "%d attributes with %d indexes (the first must be 0)", len(attrs), len(attrIdxs))
	}
	for k := range attrs {
		if k > 0 && (attrIdxs[k] <= attrIdxs[k-1] || attrIdxs[k] >= uint64(n)) {
			return errorWhy(op, cudadrv.ErrorInvalidValue, "attribute index %d (%d) out of order or past the %d copies", k, attrIdxs[k], n)
		}
		if o := attrs[k].SrcAccessOrder; o < cudadrv.MemcpySrcAccessOrderStream || o > cudadrv.MemcpySrcAccessOrderAny {
			return errorWhy(op, cudadrv.ErrorInvalidValue, "attribute %d: source access order %d", k, o)
		}
	}
	return nil
}

// batchPair is one copy of an accepted batch, its ends resolved.
type batchPair struct {
	dst, src region
	n        uint64
}

// resolveBatch resolves both ends of every copy of a batch (see
// resolveUnified), so that a batch with one bad copy queues nothing. On
// error it also returns the index of the copy at fault. d.mu must be held.
func (d *Driver) resolveBatch(op string, dsts, srcs []cudadrv.DevicePtr, sizes []uint64, dev cudadrv.Device, haveDev bool) ([]batchPair, int, error) {
	work := make([]batchPair, len(dsts))
	for i := range work {
		dst, err := d.resolveUnified(op, dsts[i], sizes[i], dev, haveDev)
		if err != nil {
			return nil, i, err
		}
		src, err := d.resolveUnified(op, srcs[i], sizes[i], dev, haveDev)
		if err != nil {
			return nil, i, err
		}
		work[i] = batchPair{dst, src, sizes[i]}
	}
	return work, -1, nil
}

// resolveUnified finds the memory of a unified address a batch copy
// names: a device allocation (of dev, when known) or a pinned host range,
// mapped or not. d.mu must be held.
func (d *Driver) resolveUnified(op string, p cudadrv.DevicePtr, n uint64, dev cudadrv.Device, haveDev bool) (region, error) {
	if n == 0 {
		return region{}, errorWhy(op, cudadrv.ErrorInvalidValue, "a copy of 0 bytes at %#x", uint64(p))
	}
	if a := d.findDev(p); a != nil {
		if haveDev && a.dev != dev {
			return region{}, errorWhy(op, cudadrv.ErrorInvalidValue, "device address %#x is memory of device %d, the stream's is %d", uint64(p), a.dev, dev)
		}
		return d.resolveDev(op, p, n)
	}
	h := d.findHost(uintptr(p))
	if h == nil {
		return region{}, errorWhy(op, cudadrv.ErrorInvalidValue, "%#x is neither device memory nor pinned host memory (the fake does not model pageable memory in a batch copy)", uint64(p))
	}
	off := uint64(uintptr(p) - h.start())
	if n > h.size-off {
		return region{}, errorWhy(op, cudadrv.ErrorInvalidValue, "%d bytes at %#x overrun the pinned range of %d bytes at %p", n, uint64(p), h.size, h.base)
	}
	return region{host: h, off: off}, nil
}

// blockCopyKernel is kernels.KernelBlockCopy(descs ptr, count u32), built
// into every fake: it reads the descriptors and the blocks through device
// addresses (device memory or mapped host memory), as the kernel does.
var blockCopyKernel = &kernel{name: kernels.KernelBlockCopy, argSizes: []int{8, 4}, fn: func(k *KernelCall) error {
	count := int(k.Uint32(1))
	descs, err := k.Mem(k.Ptr(0), uint64(count*kernels.BlockDescSize))
	if err != nil {
		return err
	}
	return kernels.BlockCopyTwin(descs, count, func(a, n uint64) ([]byte, error) { return k.Mem(cudadrv.DevicePtr(a), n) })
}}

// batchClasses returns the operation classes of a batch copy: ClassHtoD
// when one of its copies goes from host to device memory, ClassDtoH when
// one goes the other way. d.mu must be held.
func (d *Driver) batchClasses(dsts, srcs []cudadrv.DevicePtr) []string {
	host := func(p cudadrv.DevicePtr) bool { return d.findDev(p) == nil && d.findHost(uintptr(p)) != nil }
	var htod, dtoh bool
	for i := range min(len(dsts), len(srcs)) {
		s, t := host(srcs[i]), host(dsts[i])
		htod = htod || s && !t
		dtoh = dtoh || !s && t
	}
	var out []string
	if htod {
		out = append(out, ClassHtoD)
	}
	if dtoh {
		out = append(out, ClassDtoH)
	}
	return out
}
