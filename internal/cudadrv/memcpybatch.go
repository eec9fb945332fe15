package cudadrv

import (
	"fmt"
	"math"
	"unsafe"
)

// MemcpyAttributes is CUmemcpyAttributes (cuda.h, CUDA 12.8+): how the
// copies of a cuMemcpyBatchAsync that it applies to read their source.
// The layout is the C struct's, 24 bytes: srcAccessOrder (an enum, 4
// bytes), srcLocHint and dstLocHint (CUmemLocation: type enum and id int,
// 8 bytes each), flags (unsigned int). The location hints matter only for
// managed memory; zero (CU_MEM_LOCATION_TYPE_INVALID) leaves them unset.
type MemcpyAttributes struct {
	SrcAccessOrder uint32
	SrcLocType     int32
	SrcLocID       int32
	DstLocType     int32
	DstLocID       int32
	Flags          uint32
}

// CUmemcpySrcAccessOrder values.
const (
	// MemcpySrcAccessOrderStream: the source is read in stream order (it
	// may be written by earlier work on the stream, and must stay valid
	// until the stream reaches the copy).
	MemcpySrcAccessOrderStream uint32 = 0x1
	// MemcpySrcAccessOrderDuringAPICall: the source may be reused as soon
	// as the call returns.
	MemcpySrcAccessOrderDuringAPICall uint32 = 0x2
	// MemcpySrcAccessOrderAny: the source is read in any order.
	MemcpySrcAccessOrderAny uint32 = 0x3
)

// MemcpyFlagPreferOverlapWithCompute is CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE:
// a hint to run the copies so that they overlap with kernels.
const MemcpyFlagPreferOverlapWithCompute uint32 = 0x1

// MinBatchCopyVersion is the oldest driver (cuDriverGetVersion) with
// cuMemcpyBatchAsync: CUDA 12.8. From CUDA 13.0 the header maps the name
// to cuMemcpyBatchAsync_v2, which drops the failIdx out-parameter.
const MinBatchCopyVersion = 12080

// BatchCopyV2Version is the first driver version whose cuda.h maps
// cuMemcpyBatchAsync to cuMemcpyBatchAsync_v2.
const BatchCopyV2Version = 13000

// Symbol names of the two forms of the batch copy.
const (
	SymMemcpyBatchAsyncV1 = "cuMemcpyBatchAsync"    // 12.8: (..., numAttrs, size_t *failIdx, hStream)
	SymMemcpyBatchAsyncV2 = "cuMemcpyBatchAsync_v2" // 13.0: (..., numAttrs, hStream)
)

// BatchCopySymbol returns the batch-copy symbol a driver of version v
// uses, as its cuda.h names it, or "" when v predates it.
func BatchCopySymbol(v int) string {
	switch {
	case v >= BatchCopyV2Version:
		return SymMemcpyBatchAsyncV2
	case v >= MinBatchCopyVersion:
		return SymMemcpyBatchAsyncV1
	}
	return ""
}

// BatchCopier is a driver with the batch copy entry point. The real
// binding and the fake implement it; a driver without the symbol answers
// a *LoadError matching ErrNotSupported.
type BatchCopier interface {
	// MemcpyBatchAsync queues len(dsts) copies of sizes[i] bytes from
	// srcs[i] to dsts[i] on s (not the legacy default stream), as one
	// operation in stream order; the copies of one batch run in no
	// particular order. Host addresses are unified (UVA) addresses.
	// attrs[k] applies to the copies from attrIdxs[k] up to the next
	// entry's index. dsts, srcs and sizes have one length; attrs and
	// attrIdxs another. failIdx is the index of the copy the driver
	// rejected (when it says so: only the 12.8 form reports it), or -1.
	MemcpyBatchAsync(dsts, srcs []DevicePtr, sizes []uint64, attrs []MemcpyAttributes, attrIdxs []uint64, s Stream) (failIdx int, err error)
}

// BatchCopySymbolOf returns the batch-copy symbol d calls ("" when it has
// none): for the real binding the one bound at load, for the fake the one
// of its version.
func BatchCopySymbolOf(d Driver) string {
	if l, ok := d.(*lib); ok {
		if l.batchV2 {
			return SymMemcpyBatchAsyncV2
		}
		if l.s.memcpyBatchV1 != 0 {
			return SymMemcpyBatchAsyncV1
		}
		return ""
	}
	if n, ok := d.(interface{ BatchCopySymbol() string }); ok {
		return n.BatchCopySymbol()
	}
	return ""
}

// checkBatchArgs checks the slices of a batch copy before they go to C.
func checkBatchArgs(op string, dsts, srcs []DevicePtr, sizes []uint64, attrs []MemcpyAttributes, attrIdxs []uint64) error {
	if len(dsts) == 0 || len(srcs) != len(dsts) || len(sizes) != len(dsts) || len(attrs) == 0 || len(attrIdxs) != len(attrs) {
		return &Error{Op: op, Code: ErrorInvalidValue, Name: "CUDA_ERROR_INVALID_VALUE",
			Detail: fmt.Sprintf("batch of %d/%d/%d copies with %d/%d attributes", len(dsts), len(srcs), len(sizes), len(attrs), len(attrIdxs))}
	}
	return nil
}

// MemcpyBatchAsync calls cuMemcpyBatchAsync_v2 on a CUDA 13 driver and
// cuMemcpyBatchAsync (the 12.8 form, with failIdx) on a 12.8 or 12.9 one,
// as chosen at Load from cuDriverGetVersion.
func (l *lib) MemcpyBatchAsync(dsts, srcs []DevicePtr, sizes []uint64, attrs []MemcpyAttributes, attrIdxs []uint64, s Stream) (int, error) {
	if l.batchV2 {
		if err := checkBatchArgs(SymMemcpyBatchAsyncV2, dsts, srcs, sizes, attrs, attrIdxs); err != nil {
			return -1, err
		}
		err := l.call(&l.s.memcpyBatchV2, SymMemcpyBatchAsyncV2,
			uintptr(unsafe.Pointer(&dsts[0])), uintptr(unsafe.Pointer(&srcs[0])), uintptr(unsafe.Pointer(&sizes[0])), uintptr(len(dsts)),
			uintptr(unsafe.Pointer(&attrs[0])), uintptr(unsafe.Pointer(&attrIdxs[0])), uintptr(len(attrs)), uintptr(s))
		return -1, err
	}
	if err := checkBatchArgs(SymMemcpyBatchAsyncV1, dsts, srcs, sizes, attrs, attrIdxs); err != nil {
		return -1, err
	}
	fail := uint64(math.MaxUint64)
	err := l.call(&l.s.memcpyBatchV1, SymMemcpyBatchAsyncV1,
		uintptr(unsafe.Pointer(&dsts[0])), uintptr(unsafe.Pointer(&srcs[0])), uintptr(unsafe.Pointer(&sizes[0])), uintptr(len(dsts)),
		uintptr(unsafe.Pointer(&attrs[0])), uintptr(unsafe.Pointer(&attrIdxs[0])), uintptr(len(attrs)), uintptr(unsafe.Pointer(&fail)), uintptr(s))
	if err == nil || fail >= uint64(len(dsts)) {
		return -1, err
	}
	return int(fail), err
}

// bindBatchCopy picks the batch-copy entry point by the driver's version:
// the _v2 form from CUDA 13 on, else the 12.8 form. A driver that reports
// 13.0 but lacks _v2 (never seen) keeps the 12.8 form if it has that.
func (l *lib) bindBatchCopy() {
	v, err := l.DriverGetVersion()
	if err != nil {
		return
	}
	l.batchV2 = v >= BatchCopyV2Version && l.s.memcpyBatchV2 != 0
	if !l.batchV2 && v < MinBatchCopyVersion {
		l.s.memcpyBatchV1 = 0 // an older driver exporting the name is not trusted with the newer ABI
	}
	if l.s.memcpyBatchV1 == 0 && !l.batchV2 {
		l.missing[uintptr(unsafe.Pointer(&l.s.memcpyBatchV1))] = SymMemcpyBatchAsyncV1
	}
}
