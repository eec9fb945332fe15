package cudadrv

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"
)

// symbols of the driver API, by their exported (versioned) names.
type symbols struct {
	init, driverGetVersion, getErrorName, getErrorString                                   uintptr
	deviceGetCount, deviceGet, deviceGetName, deviceGetAttribute, deviceTotalMem, pciBusID uintptr
	primaryCtxRetain, primaryCtxRelease, ctxCreate, ctxDestroy                             uintptr
	ctxSetCurrent, ctxGetCurrent, ctxSynchronize, memGetInfo                               uintptr
	streamCreate, streamDestroy, streamSynchronize, streamQuery, streamWaitEvent           uintptr
	eventCreate, eventDestroy, eventRecord, eventSynchronize, eventQuery, eventElapsed     uintptr
	memAlloc, memFree, memsetD8, memsetD8Async, memsetD32                                  uintptr
	memcpyHtoD, memcpyDtoH, memcpyDtoD, memcpyHtoDAsync, memcpyDtoHAsync, memcpyDtoDAsync  uintptr
	memHostAlloc, memFreeHost, memHostRegister, memHostUnregister                          uintptr
	memHostGetDevicePointer, memHostGetFlags, pointerGetAttribute                          uintptr
	moduleLoadData, moduleUnload, moduleGetFunction, launchKernel                          uintptr

	// Newer entry points that cuda.h maps the plain names to on CUDA 13;
	// used when present, with the older ABI-stable symbol as the fallback.
	ctxCreateV4, eventElapsedV2 uintptr

	// The batch copy (CUDA 12.8+): one of the two forms is called, chosen
	// at Load by the driver's version (bindBatchCopy).
	memcpyBatchV1, memcpyBatchV2 uintptr
}

// symbolTable lists every symbol pinmem binds, with where its address goes.
// The names are the versioned ones the CUDA 12/13 headers map to.
func (s *symbols) table() []struct {
	name string
	addr *uintptr
} {
	return []struct {
		name string
		addr *uintptr
	}{
		{"cuInit", &s.init},
		{"cuDriverGetVersion", &s.driverGetVersion},
		{"cuGetErrorName", &s.getErrorName},
		{"cuGetErrorString", &s.getErrorString},
		{"cuDeviceGetCount", &s.deviceGetCount},
		{"cuDeviceGet", &s.deviceGet},
		{"cuDeviceGetName", &s.deviceGetName},
		{"cuDeviceGetAttribute", &s.deviceGetAttribute},
		{"cuDeviceTotalMem_v2", &s.deviceTotalMem},
		{"cuDeviceGetPCIBusId", &s.pciBusID},
		{"cuDevicePrimaryCtxRetain", &s.primaryCtxRetain},
		{"cuDevicePrimaryCtxRelease_v2", &s.primaryCtxRelease},
		{"cuCtxCreate_v2", &s.ctxCreate},
		{"cuCtxDestroy_v2", &s.ctxDestroy},
		{"cuCtxSetCurrent", &s.ctxSetCurrent},
		{"cuCtxGetCurrent", &s.ctxGetCurrent},
		{"cuCtxSynchronize", &s.ctxSynchronize},
		{"cuMemGetInfo_v2", &s.memGetInfo},
		{"cuStreamCreate", &s.streamCreate},
		{"cuStreamDestroy_v2", &s.streamDestroy},
		{"cuStreamSynchronize", &s.streamSynchronize},
		{"cuStreamQuery", &s.streamQuery},
		{"cuStreamWaitEvent", &s.streamWaitEvent},
		{"cuEventCreate", &s.eventCreate},
		{"cuEventDestroy_v2", &s.eventDestroy},
		{"cuEventRecord", &s.eventRecord},
		{"cuEventSynchronize", &s.eventSynchronize},
		{"cuEventQuery", &s.eventQuery},
		{"cuEventElapsedTime", &s.eventElapsed},
		{"cuMemAlloc_v2", &s.memAlloc},
		{"cuMemFree_v2", &s.memFree},
		{"cuMemsetD8_v2", &s.memsetD8},
		{"cuMemsetD8Async", &s.memsetD8Async},
		{"cuMemsetD32_v2", &s.memsetD32},
		{"cuMemcpyHtoD_v2", &s.memcpyHtoD},
		{"cuMemcpyDtoH_v2", &s.memcpyDtoH},
		{"cuMemcpyDtoD_v2", &s.memcpyDtoD},
		{"cuMemcpyHtoDAsync_v2", &s.memcpyHtoDAsync},
		{"cuMemcpyDtoHAsync_v2", &s.memcpyDtoHAsync},
		{"cuMemcpyDtoDAsync_v2", &s.memcpyDtoDAsync},
		{"cuMemHostAlloc", &s.memHostAlloc},
		{"cuMemFreeHost", &s.memFreeHost},
		{"cuMemHostRegister_v2", &s.memHostRegister},
		{"cuMemHostUnregister", &s.memHostUnregister},
		{"cuMemHostGetDevicePointer_v2", &s.memHostGetDevicePointer},
		{"cuMemHostGetFlags", &s.memHostGetFlags},
		{"cuPointerGetAttribute", &s.pointerGetAttribute},
		{"cuModuleLoadData", &s.moduleLoadData},
		{"cuModuleUnload", &s.moduleUnload},
		{"cuModuleGetFunction", &s.moduleGetFunction},
		{"cuLaunchKernel", &s.launchKernel},
	}
}

// optional lists symbols that may be missing without any feature being lost.
func (s *symbols) optional() []struct {
	name string
	addr *uintptr
} {
	return []struct {
		name string
		addr *uintptr
	}{
		{"cuCtxCreate_v4", &s.ctxCreateV4},
		{"cuEventElapsedTime_v2", &s.eventElapsedV2},
	}
}

// versioned lists symbols of which a driver has the one its version
// needs: they are in SymbolNames (the fake implements them, faults are
// injected by their names) but not in MissingSymbols' check, since no
// driver needs both.
func (s *symbols) versioned() []struct {
	name string
	addr *uintptr
} {
	return []struct {
		name string
		addr *uintptr
	}{
		{SymMemcpyBatchAsyncV1, &s.memcpyBatchV1},
		{SymMemcpyBatchAsyncV2, &s.memcpyBatchV2},
	}
}

// SymbolNames lists every driver symbol pinmem binds. The GPU suite checks
// each against the real library.
func SymbolNames() []string {
	var s symbols
	t := append(s.table(), s.versioned()...)
	names := make([]string, len(t))
	for i, e := range t {
		names[i] = e.name
	}
	return names
}

// lib is the real driver, bound with purego.
type lib struct {
	path    string
	handle  uintptr
	s       symbols
	missing map[uintptr]string // address of a zero symbol field -> its name
	batchV2 bool               // MemcpyBatchAsync calls cuMemcpyBatchAsync_v2
}

// Load opens the driver library at path, binds every symbol and calls
// cuInit(0). It never panics: a missing library or a failing cuInit is an
// error matching ErrNoDriver (or ErrNoDevice); a symbol missing from an
// older driver is reported only when the call that needs it is made, as a
// *LoadError matching ErrNotSupported.
func Load(path string) (Driver, error) {
	h, err := dlopen(path)
	if err != nil {
		return nil, &LoadError{Path: path, Err: err}
	}
	l := &lib{path: path, handle: h, missing: map[uintptr]string{}}
	for _, e := range l.s.table() {
		a, err := purego.Dlsym(h, e.name)
		if err != nil || a == 0 {
			l.missing[uintptr(unsafe.Pointer(e.addr))] = e.name
			continue
		}
		*e.addr = a
	}
	for _, e := range append(l.s.optional(), l.s.versioned()...) {
		if a, err := purego.Dlsym(h, e.name); err == nil {
			*e.addr = a
		}
	}
	for _, need := range []*uintptr{&l.s.init, &l.s.driverGetVersion} {
		if *need == 0 {
			name := l.missing[uintptr(unsafe.Pointer(need))]
			return nil, &LoadError{Path: path, Err: fmt.Errorf("required symbol %s missing", name)}
		}
	}
	r1 := ccall(l.s.init, 0)
	if r := Result(r1); r != Success {
		err := l.errorOf("cuInit", r)
		if r == ErrorNoDevice {
			return nil, err
		}
		return nil, &LoadError{Path: path, Err: err}
	}
	l.bindBatchCopy()
	return l, nil
}

// The errors of the polling queries that find work still running: polls
// return CUDA_ERROR_NOT_READY over and over, so theirs are made once,
// without an allocation and the two name lookups (driver calls) per poll.
var (
	eventNotReady  = &Error{Op: "cuEventQuery", Code: ErrorNotReady, Name: "CUDA_ERROR_NOT_READY", Detail: "device not ready"}
	streamNotReady = &Error{Op: "cuStreamQuery", Code: ErrorNotReady, Name: "CUDA_ERROR_NOT_READY", Detail: "device not ready"}
)

func (l *lib) errorOf(op string, r Result) error {
	if r == ErrorNotReady {
		switch op {
		case eventNotReady.Op:
			return eventNotReady
		case streamNotReady.Op:
			return streamNotReady
		}
	}
	return &Error{Op: op, Code: r, Name: l.ErrorName(r), Detail: l.ErrorString(r)}
}

func cString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return unsafe.String(p, n)
}

func (l *lib) ErrorName(r Result) string {
	if l.s.getErrorName == 0 {
		return ""
	}
	var p *byte
	if r1 := ccallOut(l.s.getErrorName, uintptr(r), uintptr(unsafe.Pointer(&p))); r1 != 0 {
		return ""
	}
	return cString(p)
}

func (l *lib) ErrorString(r Result) string {
	if l.s.getErrorString == 0 {
		return ""
	}
	var p *byte
	if r1 := ccallOut(l.s.getErrorString, uintptr(r), uintptr(unsafe.Pointer(&p))); r1 != 0 {
		return ""
	}
	return cString(p)
}

func (l *lib) DriverGetVersion() (int, error) {
	var v int32
	err := l.call(&l.s.driverGetVersion, "cuDriverGetVersion", uintptr(unsafe.Pointer(&v)))
	return int(v), err
}

func (l *lib) DeviceGetCount() (int, error) {
	var n int32
	err := l.call(&l.s.deviceGetCount, "cuDeviceGetCount", uintptr(unsafe.Pointer(&n)))
	return int(n), err
}

func (l *lib) DeviceGet(ordinal int) (Device, error) {
	var d int32
	err := l.call(&l.s.deviceGet, "cuDeviceGet", uintptr(unsafe.Pointer(&d)), uintptr(ordinal))
	return Device(d), err
}

func (l *lib) DeviceGetName(dev Device) (string, error) {
	buf := make([]byte, 256)
	if err := l.call(&l.s.deviceGetName, "cuDeviceGetName", uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev)); err != nil {
		return "", err
	}
	return cString(&buf[0]), nil
}

func (l *lib) DeviceGetAttribute(attr DeviceAttribute, dev Device) (int, error) {
	var v int32
	err := l.call(&l.s.deviceGetAttribute, "cuDeviceGetAttribute", uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(dev))
	return int(v), err
}

func (l *lib) DeviceTotalMem(dev Device) (uint64, error) {
	var v uint64
	err := l.call(&l.s.deviceTotalMem, "cuDeviceTotalMem_v2", uintptr(unsafe.Pointer(&v)), uintptr(dev))
	return v, err
}

func (l *lib) DeviceGetPCIBusID(dev Device) (string, error) {
	buf := make([]byte, 64)
	if err := l.call(&l.s.pciBusID, "cuDeviceGetPCIBusId", uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev)); err != nil {
		return "", err
	}
	return cString(&buf[0]), nil
}

func (l *lib) DevicePrimaryCtxRetain(dev Device) (Context, error) {
	var c uintptr
	err := l.call(&l.s.primaryCtxRetain, "cuDevicePrimaryCtxRetain", uintptr(unsafe.Pointer(&c)), uintptr(dev))
	return Context(c), err
}

func (l *lib) DevicePrimaryCtxRelease(dev Device) error {
	return l.callv(&l.s.primaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", uintptr(dev))
}

func (l *lib) CtxCreate(flags uint32, dev Device) (Context, error) {
	var c uintptr
	if l.s.ctxCreateV4 != 0 { // CUDA 12.5+: cuCtxCreate_v4(pctx, NULL params, flags, dev)
		err := l.call(&l.s.ctxCreateV4, "cuCtxCreate_v4", uintptr(unsafe.Pointer(&c)), 0, uintptr(flags), uintptr(dev))
		return Context(c), err
	}
	err := l.call(&l.s.ctxCreate, "cuCtxCreate_v2", uintptr(unsafe.Pointer(&c)), uintptr(flags), uintptr(dev))
	return Context(c), err
}

func (l *lib) CtxDestroy(ctx Context) error {
	return l.callv(&l.s.ctxDestroy, "cuCtxDestroy_v2", uintptr(ctx))
}

func (l *lib) CtxSetCurrent(ctx Context) error {
	return l.callv(&l.s.ctxSetCurrent, "cuCtxSetCurrent", uintptr(ctx))
}

func (l *lib) CtxGetCurrent() (Context, error) {
	var c uintptr
	err := l.call(&l.s.ctxGetCurrent, "cuCtxGetCurrent", uintptr(unsafe.Pointer(&c)))
	return Context(c), err
}

func (l *lib) CtxSynchronize() error {
	return l.callv(&l.s.ctxSynchronize, "cuCtxSynchronize")
}

func (l *lib) MemGetInfo() (free, total uint64, err error) {
	err = l.call(&l.s.memGetInfo, "cuMemGetInfo_v2", uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
	return free, total, err
}

func (l *lib) StreamCreate(flags uint32) (Stream, error) {
	var s uintptr
	err := l.call(&l.s.streamCreate, "cuStreamCreate", uintptr(unsafe.Pointer(&s)), uintptr(flags))
	return Stream(s), err
}

func (l *lib) StreamDestroy(s Stream) error {
	return l.callv(&l.s.streamDestroy, "cuStreamDestroy_v2", uintptr(s))
}

func (l *lib) StreamSynchronize(s Stream) error {
	return l.callv(&l.s.streamSynchronize, "cuStreamSynchronize", uintptr(s))
}

func (l *lib) StreamQuery(s Stream) error {
	return l.callv(&l.s.streamQuery, "cuStreamQuery", uintptr(s))
}

func (l *lib) StreamWaitEvent(s Stream, e Event, flags uint32) error {
	return l.callv(&l.s.streamWaitEvent, "cuStreamWaitEvent", uintptr(s), uintptr(e), uintptr(flags))
}

func (l *lib) EventCreate(flags uint32) (Event, error) {
	var e uintptr
	err := l.call(&l.s.eventCreate, "cuEventCreate", uintptr(unsafe.Pointer(&e)), uintptr(flags))
	return Event(e), err
}

func (l *lib) EventDestroy(e Event) error {
	return l.callv(&l.s.eventDestroy, "cuEventDestroy_v2", uintptr(e))
}

func (l *lib) EventRecord(e Event, s Stream) error {
	return l.callv(&l.s.eventRecord, "cuEventRecord", uintptr(e), uintptr(s))
}

func (l *lib) EventSynchronize(e Event) error {
	return l.callv(&l.s.eventSynchronize, "cuEventSynchronize", uintptr(e))
}

func (l *lib) EventQuery(e Event) error {
	return l.callv(&l.s.eventQuery, "cuEventQuery", uintptr(e))
}

func (l *lib) EventElapsedTime(start, end Event) (float32, error) {
	var ms float32
	if l.s.eventElapsedV2 != 0 {
		err := l.call(&l.s.eventElapsedV2, "cuEventElapsedTime_v2", uintptr(unsafe.Pointer(&ms)), uintptr(start), uintptr(end))
		return ms, err
	}
	err := l.call(&l.s.eventElapsed, "cuEventElapsedTime", uintptr(unsafe.Pointer(&ms)), uintptr(start), uintptr(end))
	return ms, err
}

func (l *lib) MemAlloc(size uint64) (DevicePtr, error) {
	var p uint64
	err := l.call(&l.s.memAlloc, "cuMemAlloc_v2", uintptr(unsafe.Pointer(&p)), uintptr(size))
	return DevicePtr(p), err
}

func (l *lib) MemFree(p DevicePtr) error {
	return l.callv(&l.s.memFree, "cuMemFree_v2", uintptr(p))
}

func (l *lib) MemsetD8(p DevicePtr, v byte, n uint64) error {
	return l.callv(&l.s.memsetD8, "cuMemsetD8_v2", uintptr(p), uintptr(v), uintptr(n))
}

func (l *lib) MemsetD8Async(p DevicePtr, v byte, n uint64, s Stream) error {
	return l.callv(&l.s.memsetD8Async, "cuMemsetD8Async", uintptr(p), uintptr(v), uintptr(n), uintptr(s))
}

func (l *lib) MemsetD32(p DevicePtr, v uint32, n uint64) error {
	return l.callv(&l.s.memsetD32, "cuMemsetD32_v2", uintptr(p), uintptr(v), uintptr(n))
}

func (l *lib) MemcpyHtoD(dst DevicePtr, src unsafe.Pointer, n uint64) error {
	err := l.callv(&l.s.memcpyHtoD, "cuMemcpyHtoD_v2", uintptr(dst), uintptr(src), uintptr(n))
	runtime.KeepAlive(src)
	return err
}

func (l *lib) MemcpyDtoH(dst unsafe.Pointer, src DevicePtr, n uint64) error {
	err := l.callv(&l.s.memcpyDtoH, "cuMemcpyDtoH_v2", uintptr(dst), uintptr(src), uintptr(n))
	runtime.KeepAlive(dst)
	return err
}

func (l *lib) MemcpyDtoD(dst, src DevicePtr, n uint64) error {
	return l.callv(&l.s.memcpyDtoD, "cuMemcpyDtoD_v2", uintptr(dst), uintptr(src), uintptr(n))
}

func (l *lib) MemcpyHtoDAsync(dst DevicePtr, src unsafe.Pointer, n uint64, s Stream) error {
	err := l.callv(&l.s.memcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
	runtime.KeepAlive(src)
	return err
}

func (l *lib) MemcpyDtoHAsync(dst unsafe.Pointer, src DevicePtr, n uint64, s Stream) error {
	err := l.callv(&l.s.memcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
	runtime.KeepAlive(dst)
	return err
}

func (l *lib) MemcpyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) error {
	return l.callv(&l.s.memcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
}

func (l *lib) MemHostAlloc(size uint64, flags uint32) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	err := l.call(&l.s.memHostAlloc, "cuMemHostAlloc", uintptr(unsafe.Pointer(&p)), uintptr(size), uintptr(flags))
	return p, err
}

func (l *lib) MemFreeHost(p unsafe.Pointer) error {
	err := l.callv(&l.s.memFreeHost, "cuMemFreeHost", uintptr(p))
	runtime.KeepAlive(p)
	return err
}

func (l *lib) MemHostRegister(p unsafe.Pointer, size uint64, flags uint32) error {
	err := l.callv(&l.s.memHostRegister, "cuMemHostRegister_v2", uintptr(p), uintptr(size), uintptr(flags))
	runtime.KeepAlive(p)
	return err
}

func (l *lib) MemHostUnregister(p unsafe.Pointer) error {
	err := l.callv(&l.s.memHostUnregister, "cuMemHostUnregister", uintptr(p))
	runtime.KeepAlive(p)
	return err
}

func (l *lib) MemHostGetDevicePointer(p unsafe.Pointer, flags uint32) (DevicePtr, error) {
	var d uint64
	err := l.call(&l.s.memHostGetDevicePointer, "cuMemHostGetDevicePointer_v2", uintptr(unsafe.Pointer(&d)), uintptr(p), uintptr(flags))
	return DevicePtr(d), err
}

func (l *lib) MemHostGetFlags(p unsafe.Pointer) (uint32, error) {
	var f uint32
	err := l.call(&l.s.memHostGetFlags, "cuMemHostGetFlags", uintptr(unsafe.Pointer(&f)), uintptr(p))
	return f, err
}

func (l *lib) PointerGetAttribute(attr PointerAttribute, p DevicePtr) (uint64, error) {
	var v uint64
	err := l.call(&l.s.pointerGetAttribute, "cuPointerGetAttribute", uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(p))
	return v, err
}

func (l *lib) ModuleLoadData(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, &Error{Op: "cuModuleLoadData", Code: ErrorInvalidValue, Name: "CUDA_ERROR_INVALID_VALUE", Detail: "empty image"}
	}
	img := make([]byte, len(image)+1) // NUL-terminated for PTX text
	copy(img, image)
	var m uintptr
	err := l.call(&l.s.moduleLoadData, "cuModuleLoadData", uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&img[0])))
	return Module(m), err
}

func (l *lib) ModuleUnload(m Module) error {
	return l.callv(&l.s.moduleUnload, "cuModuleUnload", uintptr(m))
}

func (l *lib) ModuleGetFunction(m Module, name string) (Function, error) {
	cname := append([]byte(name), 0)
	var f uintptr
	err := l.call(&l.s.moduleGetFunction, "cuModuleGetFunction", uintptr(unsafe.Pointer(&f)), uintptr(m), uintptr(unsafe.Pointer(&cname[0])))
	return Function(f), err
}

func (l *lib) LaunchKernel(f Function, grid, block [3]uint32, sharedMem uint32, s Stream, params unsafe.Pointer) error {
	err := l.callv(&l.s.launchKernel, "cuLaunchKernel", uintptr(f),
		uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]),
		uintptr(block[0]), uintptr(block[1]), uintptr(block[2]),
		uintptr(sharedMem), uintptr(s), uintptr(params), 0)
	runtime.KeepAlive(params)
	return err
}

// callv invokes the driver function at *addr with arguments that are
// values: handles, device addresses, sizes, and host addresses of memory
// that is not on a goroutine stack (driver-allocated or registered memory,
// or Go heap memory the method keeps alive with runtime.KeepAlive). Its
// arguments stay on the caller's stack, so a call allocates nothing: this is
// the path of the hot calls (async copies, event records, queries).
// Out-parameters (the address of a Go variable) go through call.
func (l *lib) callv(addr *uintptr, op string, args ...uintptr) error {
	fn := *addr
	if fn == 0 {
		return l.missingSymbol(addr)
	}
	if r := Result(int32(ccall(fn, args...))); r != Success {
		return l.errorOf(op, r)
	}
	return nil
}

// missingSymbol is the error of a call to a symbol the library lacks.
func (l *lib) missingSymbol(addr *uintptr) error {
	return &LoadError{Path: l.path, Symbol: l.missing[uintptr(unsafe.Pointer(addr))], Err: ErrNotSupported}
}

// call invokes the driver function at *addr and converts its CUresult. A
// symbol the library lacks is a *LoadError, never a panic. It is
// //go:uintptrescapes: an argument converted from a pointer to a Go variable
// (an out-parameter) moves that variable to the heap, where it cannot move
// while C writes to it; that costs an allocation per call, which callv
// avoids for calls without out-parameters.
//
//go:uintptrescapes
func (l *lib) call(addr *uintptr, op string, args ...uintptr) error {
	fn := *addr
	if fn == 0 {
		return l.missingSymbol(addr)
	}
	r1 := ccall(fn, args...)
	if r := Result(int32(r1)); r != Success {
		return l.errorOf(op, r)
	}
	return nil
}

// dlopen opens the library at path on one OS thread: dlerror's message,
// which purego reads after a failed dlopen, is kept per thread, and a
// goroutine moved to another thread in between would read an empty one.
func dlopen(path string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
}
