package pinmem

import (
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
)

// pointerInfo is what the driver reports about a buffer's memory, read in
// one context: cuMemHostGetFlags and the pointer attributes. Fields the
// driver would not report are zero, with the error in Errors.
type pointerInfo struct {
	HostFlags     uint32 // cuMemHostGetFlags: CU_MEMHOSTALLOC_* bits
	MemoryType    int    // CU_POINTER_ATTRIBUTE_MEMORY_TYPE (1 host, 2 device, 4 unified)
	Context       uintptr
	DevicePointer uint64
	HostPointer   uint64
	DeviceOrdinal int
	RangeStart    uint64
	RangeSize     uint64
	Mapped        bool
	// Errors holds, by name ("HostFlags", "MemoryType", ...), each query the driver refused.
	Errors map[string]error
}

// queryPointer asks the driver about b's memory with ctx current (nil: the
// buffer's device's primary context). The GPU tests use it to show what the
// driver thinks of Portable and Mapped memory from other contexts.
func queryPointer(b *Buffer, ctx *cuda.Context) (pointerInfo, error) {
	s, err := b.live()
	if err != nil {
		return pointerInfo{}, err
	}
	h := s.t.ctx
	if ctx != nil {
		h = cudadrv.Context(ctx.Handle())
	}
	info := pointerInfo{Errors: map[string]error{}}
	err = cudadrv.With(s.t.drv.d, h, func() error {
		var err error
		if info.HostFlags, err = s.t.drv.d.MemHostGetFlags(s.ptr); err != nil {
			info.Errors["HostFlags"] = err
		}
		attrs := []struct {
			name string
			a    cudadrv.PointerAttribute
			set  func(uint64)
		}{
			{"MemoryType", cudadrv.PointerAttrMemoryType, func(v uint64) { info.MemoryType = int(v) }},
			{"Context", cudadrv.PointerAttrContext, func(v uint64) { info.Context = uintptr(v) }},
			{"DevicePointer", cudadrv.PointerAttrDevicePointer, func(v uint64) { info.DevicePointer = v }},
			{"HostPointer", cudadrv.PointerAttrHostPointer, func(v uint64) { info.HostPointer = v }},
			{"DeviceOrdinal", cudadrv.PointerAttrDeviceOrdinal, func(v uint64) { info.DeviceOrdinal = int(int32(v)) }},
			{"RangeStart", cudadrv.PointerAttrRangeStart, func(v uint64) { info.RangeStart = v }},
			{"RangeSize", cudadrv.PointerAttrRangeSize, func(v uint64) { info.RangeSize = v }},
			{"Mapped", cudadrv.PointerAttrMapped, func(v uint64) { info.Mapped = v != 0 }},
		}
		for _, a := range attrs {
			v, err := s.t.drv.d.PointerGetAttribute(a.a, cudadrv.DevicePtr(uintptr(s.ptr)))
			if err != nil {
				info.Errors[a.name] = err
				continue
			}
			a.set(v)
		}
		return nil
	})
	return info, err
}
