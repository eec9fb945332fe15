// Package fakedrv is a fake CUDA driver in plain Go that implements
// cudadrv.Driver. It serves CPU tests of logic, error paths and fault
// injection in the layers above internal/cudadrv; it never stands in for a
// GPU result.
//
// What it models:
//
//   - Devices with configurable names, attributes, memory and PCI bus ids.
//   - Pinned host memory: MemHostAlloc returns real memory obtained with an
//     anonymous mmap (not Go heap); MemFreeHost unmaps it. Small requests
//     (up to 256 KiB) are placed as the driver places them, 512 bytes
//     apart in pages shared with other small allocations. Registered
//     ranges are tracked byte for byte, as the driver refuses them (a
//     range with a byte pinned already -> 712, one sharing only a page is
//     registered; unknown unregister -> 713).
//     Registering Go memory is allowed (callers pin it with
//     runtime.Pinner). One copy may not span two allocations or
//     registrations (-> 1).
//   - Device memory at fake addresses (from 0x7f0000000000, 256-byte
//     aligned, with a gap between allocations) backed by Go byte slices that
//     are allocated on first touch. Copies and memsets really move bytes.
//     With unified addressing the device pointer of mapped host memory is
//     the host address itself, and copies to or from it touch host memory.
//   - Streams and events with ordering: asynchronous work is queued per
//     stream and runs in order, as soon as nothing holds it back. A test can
//     hold a stream (HoldStream/ReleaseStream) or everything (Pause/Resume)
//     so queued work waits; queries then answer not-ready and synchronizing
//     calls block until another goroutine releases the work (or until
//     Options.WaitTimeout, after which they fail instead of hanging the
//     test). The legacy default stream (handle 0, CU_STREAM_LEGACY = 1 and
//     CU_STREAM_PER_THREAD = 2 are all treated as it) synchronizes with
//     blocking streams as in CUDA; synchronous copies and memsets run on it.
//     StreamWaitEvent is honoured.
//   - Asynchronous work that touches memory freed or unregistered before it
//     ran fails with CUDA_ERROR_ILLEGAL_ADDRESS: this catches reuse of
//     buffers before the stream is done with them. As on a GPU, such a
//     fault (and a kernel's failure) is sticky: every later call in its
//     context reports it again (see stuck). An injected asynchronous
//     fault that is not sticky is reported once, by the first query or
//     synchronization of its stream, of an event recorded after it, or of
//     the context. AsyncErrors lists every one. Asynchronous copies to or from pageable (not pinned) host
//     memory behave like the driver's: HtoD stages the source at call time,
//     DtoH returns only once the copy ran.
//   - Contexts: primary contexts with reference counts, CtxCreate and
//     CtxDestroy. As in CUDA, a context is current per OS thread (keyed by
//     the Linux thread id; elsewhere the process counts as one thread).
//     Calls that work in "the current context" fail with
//     CUDA_ERROR_INVALID_CONTEXT when none is current on the calling thread:
//     cuCtxSynchronize, cuMemGetInfo, cuStreamCreate, cuEventCreate,
//     cuMemAlloc, cuMemHostAlloc, cuMemHostRegister,
//     cuMemHostGetDevicePointer, cuModuleLoadData, the synchronous copies and
//     memsets, and any work on the legacy default stream (handles 0, 1, 2).
//     Work on an explicit stream or event takes the context from its handle
//     and needs none current, but fails with CUDA_ERROR_INVALID_CONTEXT when
//     another context than the stream's is current. Frees, destroys,
//     unregistrations and pointer queries need no context. Memory calls use
//     the device of the current context.
//   - Modules: ModuleLoadData accepts PTX-like text (beginning with "//" or
//     ".version" after white space) and ELF images; ModuleGetFunction finds
//     kernels registered with RegisterKernel, whose Go function runs in
//     stream order when launched, and pinmem's own block-copy kernel
//     (kernels.KernelBlockCopy), built in.
//   - Fault injection (FailOn, FailAsync, AddRule, SetHook) by driver
//     symbol name, as the real binding names them (e.g. "cuMemAlloc_v2"),
//     or by operation class (ClassHtoD, ...); sticky faults that fail every
//     later call in their context; call and live object counters; which
//     call is blocked on held work (Blocked).
//
// The fake starts no goroutines. All methods are safe for concurrent use.
package fakedrv

import (
	"fmt"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/track"
)

// DriverVersion is what DriverGetVersion reports unless Options say otherwise.
const DriverVersion = 13000

// DefaultWaitTimeout is how long a synchronizing call waits for held work
// before it fails, unless Options.WaitTimeout says otherwise.
const DefaultWaitTimeout = 20 * time.Second

// DeviceSpec describes one fake device.
type DeviceSpec struct {
	Name     string // default "Fake NVIDIA H200"
	TotalMem uint64 // bytes; default 16 GiB
	PCIBusID string // default "0000:<ordinal+1>:00.0" style
	// Attrs overrides or adds device attributes; the rest come from
	// DefaultAttrs. Attributes in neither read as 0.
	Attrs map[cudadrv.DeviceAttribute]int
}

// DefaultAttrs returns the attributes of a default fake device: a discrete
// compute capability 9.0 GPU with unified addressing, host mapping and host
// registration, two copy engines.
func DefaultAttrs() map[cudadrv.DeviceAttribute]int {
	return map[cudadrv.DeviceAttribute]int{
		cudadrv.AttrMaxThreadsPerBlock:            1024,
		cudadrv.AttrClockRate:                     1980000,
		cudadrv.AttrMultiprocessorCount:           132,
		cudadrv.AttrIntegrated:                    0,
		cudadrv.AttrCanMapHostMemory:              1,
		cudadrv.AttrComputeMode:                   0,
		cudadrv.AttrMemoryClockRate:               3201000,
		cudadrv.AttrGlobalMemoryBusWidth:          6144,
		cudadrv.AttrAsyncEngineCount:              2,
		cudadrv.AttrUnifiedAddressing:             1,
		cudadrv.AttrComputeCapabilityMajor:        9,
		cudadrv.AttrComputeCapabilityMinor:        0,
		cudadrv.AttrManagedMemory:                 1,
		cudadrv.AttrConcurrentManagedAccess:       1,
		cudadrv.AttrCanUseHostPointerForRegMem:    1,
		cudadrv.AttrHostRegisterSupported:         1,
		cudadrv.AttrReadOnlyHostRegisterSupported: 1,
		cudadrv.AttrNUMAConfig:                    0,
		cudadrv.AttrNUMAID:                        -1,
		cudadrv.AttrHostNUMAID:                    0,
	}
}

// Options configure a fake driver. The zero value is one default device.
type Options struct {
	// Devices lists the devices. When nil, DeviceCount default devices are
	// made (one when DeviceCount is 0). A non-nil empty slice means no device.
	Devices     []DeviceSpec
	DeviceCount int
	// DriverVersion is reported by DriverGetVersion; 0 means 13000.
	DriverVersion int
	// DeviceMemLimit caps the device memory allocatable on each device, in
	// bytes; 0 means the device's TotalMem. Beyond it MemAlloc fails with
	// CUDA_ERROR_OUT_OF_MEMORY.
	DeviceMemLimit uint64
	// HostAllocLimit caps the bytes live from MemHostAlloc; 0 means no cap.
	// Beyond it MemHostAlloc fails with CUDA_ERROR_OUT_OF_MEMORY.
	HostAllocLimit uint64
	// RegisterLimit caps the bytes registered with MemHostRegister; 0 means
	// no cap. Beyond it MemHostRegister fails with CUDA_ERROR_OUT_OF_MEMORY.
	RegisterLimit uint64
	// WaitTimeout bounds how long a synchronizing call blocks on held work
	// before failing with CUDA_ERROR_LAUNCH_TIMEOUT; 0 means
	// DefaultWaitTimeout, negative means wait forever.
	WaitTimeout time.Duration
}

type device struct {
	spec    DeviceSpec
	attrs   map[cudadrv.DeviceAttribute]int
	used    uint64 // device bytes allocated
	limit   uint64
	primary int // primary context reference count
}

// Driver is a fake CUDA driver. Create it with New.
type Driver struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced when queued work makes progress or holds change

	version int
	timeout time.Duration
	devs    []*device

	calls map[string]int
	rules []*rule
	hook  func(op string) cudadrv.Result

	cur      map[int]cudadrv.Context            // the context current on each OS thread
	contexts map[cudadrv.Context]cudadrv.Device // created (non-primary) contexts
	nextCtx  uintptr

	host           []*hostRange // sorted by base
	slabs          []*hostSlab  // pinned pages small allocations are placed in
	hostAllocBytes uint64
	regBytes       uint64
	hostAllocLimit uint64
	regLimit       uint64

	dev     []*devAlloc // sorted by base
	nextDev uint64

	def        *stream
	streams    map[cudadrv.Stream]*stream
	active     []*stream // streams with a handle or pending work, in creation order
	nextStream uintptr
	streamSeq  int
	paused     bool
	waiters    map[*waiter]bool          // calls blocked in waitFor
	polls      int                       // queries that found work not ready
	pollOp     string                    // the driver function of the latest one
	sticky     map[cudadrv.Context]error // contexts a sticky fault broke

	events    map[cudadrv.Event]*event
	nextEvent uintptr

	kernels   map[string]*kernel
	modules   map[cudadrv.Module]*module
	funcs     map[cudadrv.Function]*function
	nextMod   uintptr
	nextFunc  uintptr
	asyncErrs []error
	pageable  int
	closed    bool
}

var _ cudadrv.Driver = (*Driver)(nil)

// fakes counts the fakes made, so that each numbers its handles and
// device addresses apart from the others': pinmem's record of live objects
// (internal/track) keys them by handle, and a nested fake's objects must
// not be taken for an outer one's.
var fakes atomic.Uint64

// New returns a fake driver configured by opts.
func New(opts Options) *Driver {
	n := fakes.Add(1) % 32
	d := &Driver{
		changed:        make(chan struct{}),
		version:        opts.DriverVersion,
		timeout:        opts.WaitTimeout,
		calls:          map[string]int{},
		cur:            map[int]cudadrv.Context{},
		contexts:       map[cudadrv.Context]cudadrv.Device{},
		nextCtx:        0xc100_0000 + uintptr(n)<<20,
		hostAllocLimit: opts.HostAllocLimit,
		regLimit:       opts.RegisterLimit,
		nextDev:        devBase + n<<40,
		streams:        map[cudadrv.Stream]*stream{},
		nextStream:     0x5000_0000 + uintptr(n)<<24,
		events:         map[cudadrv.Event]*event{},
		nextEvent:      0xe000_0000 + uintptr(n)<<24,
		kernels:        map[string]*kernel{kernels.KernelBlockCopy: blockCopyKernel},
		modules:        map[cudadrv.Module]*module{},
		funcs:          map[cudadrv.Function]*function{},
		nextMod:        0x3000_0000 + uintptr(n)<<24,
		nextFunc:       0xf000_0000 + uintptr(n)<<24,
		waiters:        map[*waiter]bool{},
		sticky:         map[cudadrv.Context]error{},
	}
	if d.version == 0 {
		d.version = DriverVersion
	}
	if d.timeout == 0 {
		d.timeout = DefaultWaitTimeout
	}
	specs := opts.Devices
	if specs == nil {
		n := opts.DeviceCount
		if n <= 0 {
			n = 1
		}
		specs = make([]DeviceSpec, n)
	}
	for i, s := range specs {
		if s.Name == "" {
			s.Name = "Fake NVIDIA H200"
		}
		if s.TotalMem == 0 {
			s.TotalMem = 16 << 30
		}
		if s.PCIBusID == "" {
			s.PCIBusID = fmt.Sprintf("0000:%02X:00.0", 0x18+i)
		}
		attrs := DefaultAttrs()
		for k, v := range s.Attrs {
			attrs[k] = v
		}
		var bus, dom int
		fmt.Sscanf(s.PCIBusID, "%x:%x", &dom, &bus)
		if _, ok := s.Attrs[cudadrv.AttrPCIBusID]; !ok {
			attrs[cudadrv.AttrPCIBusID] = bus
		}
		if _, ok := s.Attrs[cudadrv.AttrPCIDomainID]; !ok {
			attrs[cudadrv.AttrPCIDomainID] = dom
		}
		limit := s.TotalMem
		if opts.DeviceMemLimit != 0 {
			limit = opts.DeviceMemLimit
		}
		d.devs = append(d.devs, &device{spec: s, attrs: attrs, limit: limit})
	}
	d.def = &stream{h: 0}
	d.active = []*stream{d.def}
	return d
}

// IsFake reports true: it lets test helpers tell a fake driver from the real one.
func (d *Driver) IsFake() bool { return true }

// Close marks the driver closed; calls after Close fail with
// CUDA_ERROR_DEINITIALIZED. Pinned allocations still live (leaked) stay
// mapped: code may still hold slices of them, and their addresses must not
// come back from a later mapping while pinmem counts them as pinned. The
// fake starts no goroutines, so Close is optional.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	for _, s := range d.active {
		for _, o := range s.queue {
			o.cancelled = true
		}
		s.queue = nil
		s.held = false
	}
	d.notify()
	return nil
}

// ---- errors and fault injection ----

var errNames = map[cudadrv.Result][2]string{
	cudadrv.Success:                          {"CUDA_SUCCESS", "no error"},
	cudadrv.ErrorInvalidValue:                {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	cudadrv.ErrorOutOfMemory:                 {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	cudadrv.ErrorNotInitialized:              {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	cudadrv.ErrorDeinitialized:               {"CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
	cudadrv.ErrorStubLibrary:                 {"CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
	cudadrv.ErrorNoDevice:                    {"CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	cudadrv.ErrorInvalidDevice:               {"CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	cudadrv.ErrorInvalidImage:                {"CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	cudadrv.ErrorInvalidContext:              {"CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	cudadrv.ErrorNoBinaryForGPU:              {"CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
	cudadrv.ErrorNotMapped:                   {"CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
	cudadrv.ErrorInvalidPTX:                  {"CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
	cudadrv.ErrorJITCompilerNotFound:         {"CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "PTX JIT compiler library not found"},
	cudadrv.ErrorUnsupportedPTXVersion:       {"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
	cudadrv.ErrorInvalidHandle:               {"CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	cudadrv.ErrorNotFound:                    {"CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	cudadrv.ErrorNotReady:                    {"CUDA_ERROR_NOT_READY", "device not ready"},
	cudadrv.ErrorIllegalAddress:              {"CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	cudadrv.ErrorLaunchOutOfResources:        {"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
	cudadrv.ErrorLaunchTimeout:               {"CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
	cudadrv.ErrorHostMemoryAlreadyRegistered: {"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
	cudadrv.ErrorHostMemoryNotRegistered:     {"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
	cudadrv.ErrorLaunchFailed:                {"CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
	cudadrv.ErrorNotPermitted:                {"CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
	cudadrv.ErrorNotSupported:                {"CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	cudadrv.ErrorSystemDriverMismatch:        {"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
	cudadrv.ErrorUnknown:                     {"CUDA_ERROR_UNKNOWN", "unknown error"},
}

// ErrorName is cuGetErrorName: the CUDA_ERROR_* name of r, or "" for a code
// the fake does not know (as the real binding returns for unknown codes).
func (d *Driver) ErrorName(r cudadrv.Result) string { return errNames[r][0] }

// ErrorString is cuGetErrorString: the driver's description of r, or "".
func (d *Driver) ErrorString(r cudadrv.Result) string { return errNames[r][1] }

// errorOf builds the error the real binding would return.
func errorOf(op string, r cudadrv.Result) *cudadrv.Error {
	n := errNames[r]
	return &cudadrv.Error{Op: op, Code: r, Name: n[0], Detail: n[1]}
}

// errorWhy is errorOf with an explanation of the fake appended to Detail.
func errorWhy(op string, r cudadrv.Result, format string, args ...any) *cudadrv.Error {
	e := errorOf(op, r)
	e.Detail += "; cudatest: " + fmt.Sprintf(format, args...)
	return e
}

type rule struct {
	op     string // a driver symbol or an operation class
	left   int    // calls to let pass before firing; -1: fire on every call
	code   cudadrv.Result
	async  bool
	sticky bool
	spent  bool
	origin int
}

// inject is the fault a call's work fails with when it runs (FailAsync):
// code Success for none.
type inject struct {
	code   cudadrv.Result
	sticky bool
	rule   string // the rule's op and nth, for the message
	r      *rule  // the rule, until the call queued the work it fails (see refund)
}

// refund gives an asynchronous fault back to its rule when the call that
// drew it queued no work (the call was refused): the fault is for work,
// so the next call's work takes it. Call it deferred, with d.mu held, after
// clearing in.r once the work is queued.
func (d *Driver) refund(in *inject) {
	if in.r != nil && in.r.origin > 0 {
		in.r.spent, in.r.left = false, 0
	}
}

// Operation classes: FailOn, FailAsync and Calls take one in place of a
// driver symbol to mean every call of the class, whichever symbol a path
// of the code under test calls. cudatest exports them (AnyHtoD, ...) with
// the same values; its tests of the classes fail if they drift apart.
const (
	// ClassHtoD is any host-to-device copy: cuMemcpyHtoD_v2,
	// cuMemcpyHtoDAsync_v2, and a batch copy with a host source and a
	// device destination.
	ClassHtoD = "any host-to-device copy"
	// ClassDtoH is any device-to-host copy: cuMemcpyDtoH_v2,
	// cuMemcpyDtoHAsync_v2, and a batch copy with a device source and a
	// host destination.
	ClassDtoH = "any device-to-host copy"
	// ClassLaunch is any kernel launch: cuLaunchKernel.
	ClassLaunch = "any kernel launch"
	// ClassAlloc is any allocation of device or pinned host memory:
	// cuMemAlloc_v2, cuMemHostAlloc, cuMemHostRegister_v2.
	ClassAlloc = "any allocation"
)

// QueuesWork reports whether the calls of op (a driver symbol or an
// operation class) queue work on a stream that can fail when it runs, as
// FailAsync needs: copies, memsets and kernel launches. The other calls
// take no asynchronous fault: a rule for them would never fire.
func QueuesWork(op string) bool { return queuesWork[op] }

var queuesWork = map[string]bool{
	ClassHtoD: true, ClassDtoH: true, ClassLaunch: true,
	"cuMemcpyHtoD_v2": true, "cuMemcpyHtoDAsync_v2": true,
	"cuMemcpyDtoH_v2": true, "cuMemcpyDtoHAsync_v2": true,
	"cuMemcpyDtoD_v2": true, "cuMemcpyDtoDAsync_v2": true,
	"cuMemcpyBatchAsync": true, "cuMemcpyBatchAsync_v2": true,
	"cuMemsetD8_v2": true, "cuMemsetD8Async": true, "cuMemsetD32_v2": true,
	"cuLaunchKernel": true,
}

// Classes returns the operation classes.
func Classes() []string { return []string{ClassHtoD, ClassDtoH, ClassLaunch, ClassAlloc} }

// classOf is the class of the calls of a symbol that always belong to one.
var classOf = map[string]string{
	"cuMemcpyHtoD_v2":      ClassHtoD,
	"cuMemcpyHtoDAsync_v2": ClassHtoD,
	"cuMemcpyDtoH_v2":      ClassDtoH,
	"cuMemcpyDtoHAsync_v2": ClassDtoH,
	"cuLaunchKernel":       ClassLaunch,
	"cuMemAlloc_v2":        ClassAlloc,
	"cuMemHostAlloc":       ClassAlloc,
	"cuMemHostRegister_v2": ClassAlloc,
}

var knownOps = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range cudadrv.SymbolNames() {
		m[n] = true
	}
	for _, c := range Classes() {
		m[c] = true
	}
	return m
}()

// FailOn makes the nth call to op from now on (1 = the next one) fail with
// code, once; nth <= 0 makes every call fail until ClearFaults. op is the
// driver symbol as the real binding names it, e.g. "cuMemHostAlloc",
// "cuStreamCreate", "cuMemcpyHtoDAsync_v2", or an operation class
// (ClassHtoD, ...). The failing call has no effect.
// FailOn returns an error for an unknown op or a success code.
func (d *Driver) FailOn(op string, nth int, code cudadrv.Result) error {
	return d.AddRule(op, nth, code, false, false)
}

// FailAsync is like FailOn for an asynchronous operation (a copy, memset or
// kernel launch), except that the call itself succeeds and the operation
// fails when it runs in its stream; the fault is then reported as exec
// says, as a GPU reports an asynchronous fault.
func (d *Driver) FailAsync(op string, nth int, code cudadrv.Result) error {
	return d.AddRule(op, nth, code, true, false)
}

// AddRule is FailOn (async false) or FailAsync (async true); a sticky
// fault, once it happened, also fails every later call in its context with
// code (see Stuck), until ClearFaults.
func (d *Driver) AddRule(op string, nth int, code cudadrv.Result, async, sticky bool) error {
	if !knownOps[op] {
		return fmt.Errorf("cudatest: unknown driver op %q (want a driver symbol or an operation class)", op)
	}
	if async && !QueuesWork(op) {
		return fmt.Errorf("cudatest: %s queues no work on a stream, so no asynchronous fault can hit it", op)
	}
	if code == cudadrv.Success {
		return fmt.Errorf("cudatest: fault code for %s must not be CUDA_SUCCESS", op)
	}
	left := nth - 1
	if nth <= 0 {
		left = -1
	}
	d.mu.Lock()
	d.rules = append(d.rules, &rule{op: op, left: left, code: code, async: async, sticky: sticky, origin: nth})
	d.mu.Unlock()
	return nil
}

// stick makes every later call in ctx fail with err (a sticky fault).
// d.mu must be held.
func (d *Driver) stick(ctx cudadrv.Context, err error) {
	if ctx != 0 && d.sticky[ctx] == nil {
		d.sticky[ctx] = err
	}
}

// stuck returns the sticky fault of ctx, as the call op reports it, or
// nil. Calls that release an object (frees, destroys, unregistrations,
// unloads) do not check it, so that a test can still clean up and check
// for leaks. d.mu must be held.
func (d *Driver) stuck(op string, ctx cudadrv.Context) error {
	if err := d.sticky[ctx]; err != nil {
		return relabelFor(err, op)
	}
	return nil
}

// Stuck returns the sticky fault of the context ctx, or nil.
func (d *Driver) Stuck(ctx cudadrv.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sticky[ctx]
}

// SetHook installs a function called (without the driver's lock held) at
// the start of every driver call with its op name; a result other than
// Success makes the call fail with it and have no effect. nil removes it.
func (d *Driver) SetHook(h func(op string) cudadrv.Result) {
	d.mu.Lock()
	d.hook = h
	d.mu.Unlock()
}

// ClearFaults removes every FailOn and FailAsync rule and the hook, and
// resets the contexts a sticky fault broke: their calls work again, and
// the faults of their streams not reported yet are forgotten.
func (d *Driver) ClearFaults() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rules = nil
	d.hook = nil
	for _, s := range d.active {
		// A fault knows its context: on the legacy default stream, which
		// serves every context, that of the work that faulted.
		if s.err != nil && d.sticky[s.err.ctx] != nil {
			s.err.reported = true
		}
	}
	clear(d.sticky)
}

// begin counts a call of op, and of its class when it has one (the calls
// of a batch copy name theirs), and applies fault injection. It returns
// the fault to fail the operation with when it runs (FailAsync) or the
// error to return now. It must be called without d.mu held.
func (d *Driver) begin(op string, classes ...string) (inject, error) {
	if c, ok := classOf[op]; ok {
		classes = append(classes, c)
	}
	d.mu.Lock()
	d.calls[op]++
	for _, c := range classes {
		d.calls[c]++
	}
	if d.closed {
		d.mu.Unlock()
		return inject{}, errorWhy(op, cudadrv.ErrorDeinitialized, "driver closed")
	}
	var fire *rule
	for _, r := range d.rules {
		if r.spent || (r.op != op && !slices.Contains(classes, r.op)) {
			continue
		}
		if r.left > 0 {
			r.left--
			continue
		}
		if r.left == 0 {
			r.spent = true
		}
		if fire == nil {
			fire = r
		}
	}
	var err error
	if fire != nil && !fire.async {
		err = errorWhy(op, fire.code, "injected fault (FailOn %s)", fire.name())
		if fire.sticky {
			d.stick(d.cur[threadID()], err)
		}
	}
	hook := d.hook
	d.mu.Unlock()
	if fire != nil {
		if fire.async {
			return inject{code: fire.code, sticky: fire.sticky, rule: fire.name(), r: fire}, nil
		}
		return inject{}, err
	}
	if hook != nil {
		if r := hook(op); r != cudadrv.Success {
			return inject{}, errorWhy(op, r, "injected fault (hook)")
		}
	}
	return inject{}, nil
}

// name is how messages name the rule.
func (r *rule) name() string {
	if r.origin <= 0 {
		return r.op + ", every call"
	}
	return fmt.Sprintf("%s, call %d", r.op, r.origin)
}

// ---- counters ----

// Counts are the live objects of a fake driver.
type Counts struct {
	HostAllocs      int    // live MemHostAlloc allocations
	HostAllocBytes  uint64 // their bytes
	Registrations   int    // live MemHostRegister ranges
	RegisteredBytes uint64 // their bytes
	DeviceAllocs    int    // live MemAlloc allocations
	DeviceBytes     uint64 // their bytes
	Streams         int    // streams created and not destroyed
	Events          int    // events created and not destroyed
	Modules         int    // modules loaded and not unloaded
	Contexts        int    // contexts from CtxCreate not destroyed
	PrimaryRefs     int    // primary context references, over all devices
	PendingOps      int    // queued asynchronous operations not yet run
}

// Live returns the live object counts.
func (d *Driver) Live() Counts {
	d.mu.Lock()
	defer d.mu.Unlock()
	var c Counts
	for _, h := range d.host {
		if h.alloc {
			c.HostAllocs++
			c.HostAllocBytes += h.size
		} else {
			c.Registrations++
			c.RegisteredBytes += h.size
		}
	}
	for _, a := range d.dev {
		c.DeviceAllocs++
		c.DeviceBytes += a.size
	}
	c.Streams = len(d.streams)
	c.Events = len(d.events)
	c.Modules = len(d.modules)
	c.Contexts = len(d.contexts)
	for _, dv := range d.devs {
		c.PrimaryRefs += dv.primary
	}
	for _, s := range d.active {
		c.PendingOps += len(s.queue)
	}
	return c
}

// Leaks returns an error describing live streams, events, modules,
// contexts, allocations, registrations, primary context references and
// queued work that never ran, or nil when there are none.
func (d *Driver) Leaks() error {
	parts, stacks := d.LeakReport(true)
	if len(parts) == 0 {
		return nil
	}
	return fmt.Errorf("cudatest: live objects: %s%s", strings.Join(parts, ", "), stacks)
}

// LeakReport describes what is live in this fake: parts has one phrase per
// kind of object left ("2 stream(s)", "1 device allocation(s) (64
// bytes)", "3 queued operation(s) that never ran"), and stacks, when
// pinmem recorded the creation of some of them (internal/track), lists
// each such object live in this fake, not another, with the stack that
// created it, starting on a new line. Primary context references count
// only when primary is true: package cuda keeps them for the life of the
// process.
func (d *Driver) LeakReport(primary bool) (parts []string, stacks string) {
	c := d.Live()
	add := func(n int, bytes uint64, what string) {
		switch {
		case n != 0 && bytes != 0:
			parts = append(parts, fmt.Sprintf("%d %s (%d bytes)", n, what, bytes))
		case n != 0:
			parts = append(parts, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(c.Streams, 0, "stream(s)")
	add(c.Events, 0, "event(s)")
	add(c.Modules, 0, "module(s)")
	add(c.Contexts, 0, "context(s)")
	add(c.DeviceAllocs, c.DeviceBytes, "device allocation(s)")
	add(c.HostAllocs, c.HostAllocBytes, "pinned allocation(s)")
	add(c.Registrations, c.RegisteredBytes, "registration(s)")
	add(c.PendingOps, 0, "queued operation(s) that never ran")
	if primary {
		add(c.PrimaryRefs, 0, "primary context reference(s)")
	}
	if len(parts) == 0 {
		return nil, ""
	}
	var b strings.Builder
	for _, o := range track.Live() {
		if !d.owns(o.Kind, o.ID) {
			continue
		}
		fmt.Fprintf(&b, "\n- %s %#x", o.Kind, o.ID)
		if o.Size > 0 {
			fmt.Fprintf(&b, " (%d bytes)", o.Size)
		}
		if o.Stack != "" {
			b.WriteString(", created at:\n")
			b.WriteString(strings.TrimRight(o.Stack, "\n"))
		}
	}
	return parts, b.String()
}

// owns reports whether the object pinmem recorded as kind k with handle or
// address id is live in this fake.
func (d *Driver) owns(k track.Kind, id uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch k {
	case track.Stream:
		return d.streams[cudadrv.Stream(id)] != nil
	case track.Event:
		return d.events[cudadrv.Event(id)] != nil
	case track.Module:
		return d.modules[cudadrv.Module(id)] != nil
	case track.Context:
		_, ok := d.contexts[cudadrv.Context(id)]
		return ok
	case track.DeviceMemory:
		a := d.findDev(cudadrv.DevicePtr(id))
		return a != nil && uint64(a.base) == id
	case track.HostAlloc, track.Registration:
		h := d.findHost(uintptr(id))
		return h != nil && uint64(h.start()) == id && h.alloc == (k == track.HostAlloc)
	}
	return false
}

// Calls returns how many times op (a driver symbol name or an operation
// class) was called, including calls that failed.
func (d *Driver) Calls(op string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[op]
}

// CallCounts returns a copy of the call counts of every op called so far.
func (d *Driver) CallCounts() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := make(map[string]int, len(d.calls))
	for k, v := range d.calls {
		m[k] = v
	}
	return m
}

// Ops returns the driver symbols the fake implements, sorted.
func Ops() []string {
	ops := slices.Clone(cudadrv.SymbolNames())
	ops = slices.DeleteFunc(ops, func(s string) bool {
		return s == "cuInit" || s == "cuGetErrorName" || s == "cuGetErrorString"
	})
	sort.Strings(ops)
	return ops
}

// PageableAsyncCopies returns how many asynchronous copies had a pageable
// (neither allocated nor registered) host side.
func (d *Driver) PageableAsyncCopies() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pageable
}

// AsyncErrors returns every error asynchronous work produced so far, in order.
func (d *Driver) AsyncErrors() []error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.asyncErrs)
}

// ---- devices and contexts ----

func (d *Driver) device(op string, dev cudadrv.Device) (*device, error) {
	if dev < 0 || int(dev) >= len(d.devs) {
		return nil, errorWhy(op, cudadrv.ErrorInvalidDevice, "device %d of %d", dev, len(d.devs))
	}
	return d.devs[dev], nil
}

// DriverGetVersion is cuDriverGetVersion.
func (d *Driver) DriverGetVersion() (int, error) {
	if _, err := d.begin("cuDriverGetVersion"); err != nil {
		return 0, err
	}
	return d.version, nil
}

// DeviceGetCount is cuDeviceGetCount.
func (d *Driver) DeviceGetCount() (int, error) {
	if _, err := d.begin("cuDeviceGetCount"); err != nil {
		return 0, err
	}
	return len(d.devs), nil
}

// DeviceGet is cuDeviceGet.
func (d *Driver) DeviceGet(ordinal int) (cudadrv.Device, error) {
	const op = "cuDeviceGet"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	if ordinal < 0 || ordinal >= len(d.devs) {
		return 0, errorWhy(op, cudadrv.ErrorInvalidDevice, "ordinal %d of %d", ordinal, len(d.devs))
	}
	return cudadrv.Device(ordinal), nil
}

// DeviceGetName is cuDeviceGetName.
func (d *Driver) DeviceGetName(dev cudadrv.Device) (string, error) {
	const op = "cuDeviceGetName"
	if _, err := d.begin(op); err != nil {
		return "", err
	}
	dv, err := d.device(op, dev)
	if err != nil {
		return "", err
	}
	return dv.spec.Name, nil
}

// DeviceGetAttribute is cuDeviceGetAttribute. Attributes not configured read as 0.
func (d *Driver) DeviceGetAttribute(attr cudadrv.DeviceAttribute, dev cudadrv.Device) (int, error) {
	const op = "cuDeviceGetAttribute"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	dv, err := d.device(op, dev)
	if err != nil {
		return 0, err
	}
	if attr <= 0 || attr > 200 {
		return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "attribute %d", attr)
	}
	return dv.attrs[attr], nil
}

// DeviceTotalMem is cuDeviceTotalMem_v2.
func (d *Driver) DeviceTotalMem(dev cudadrv.Device) (uint64, error) {
	const op = "cuDeviceTotalMem_v2"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	dv, err := d.device(op, dev)
	if err != nil {
		return 0, err
	}
	return dv.spec.TotalMem, nil
}

// DeviceGetPCIBusID is cuDeviceGetPCIBusId.
func (d *Driver) DeviceGetPCIBusID(dev cudadrv.Device) (string, error) {
	const op = "cuDeviceGetPCIBusId"
	if _, err := d.begin(op); err != nil {
		return "", err
	}
	dv, err := d.device(op, dev)
	if err != nil {
		return "", err
	}
	return dv.spec.PCIBusID, nil
}

const primaryBase = 0xc0000000

func primaryHandle(dev cudadrv.Device) cudadrv.Context {
	return cudadrv.Context(primaryBase + 0x100*uintptr(dev+1))
}

// primaryDevice returns the device whose primary context is c, or -1.
func (d *Driver) primaryDevice(c cudadrv.Context) cudadrv.Device {
	for i := range d.devs {
		if primaryHandle(cudadrv.Device(i)) == c {
			return cudadrv.Device(i)
		}
	}
	return -1
}

// DevicePrimaryCtxRetain is cuDevicePrimaryCtxRetain: it returns the same
// handle for a device every time and counts references.
func (d *Driver) DevicePrimaryCtxRetain(dev cudadrv.Device) (cudadrv.Context, error) {
	const op = "cuDevicePrimaryCtxRetain"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	dv, err := d.device(op, dev)
	if err != nil {
		return 0, err
	}
	dv.primary++
	return primaryHandle(dev), nil
}

// DevicePrimaryCtxRelease is cuDevicePrimaryCtxRelease_v2. Releasing more
// often than retained fails with CUDA_ERROR_INVALID_CONTEXT.
func (d *Driver) DevicePrimaryCtxRelease(dev cudadrv.Device) error {
	const op = "cuDevicePrimaryCtxRelease_v2"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	dv, err := d.device(op, dev)
	if err != nil {
		return err
	}
	if dv.primary == 0 {
		return errorWhy(op, cudadrv.ErrorInvalidContext, "primary context of device %d not retained", dev)
	}
	dv.primary--
	if dv.primary == 0 {
		d.uncurrent(primaryHandle(dev))
	}
	return nil
}

// PrimaryRefs returns the reference count of dev's primary context.
func (d *Driver) PrimaryRefs(dev cudadrv.Device) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if dev < 0 || int(dev) >= len(d.devs) {
		return 0
	}
	return d.devs[dev].primary
}

// CtxCreate is cuCtxCreate_v2; the new context becomes current.
func (d *Driver) CtxCreate(flags uint32, dev cudadrv.Device) (cudadrv.Context, error) {
	const op = "cuCtxCreate_v2"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.device(op, dev); err != nil {
		return 0, err
	}
	if flags&^0x1f != 0 {
		return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "flags %#x", flags)
	}
	d.nextCtx += 0x100
	c := cudadrv.Context(d.nextCtx)
	d.contexts[c] = dev
	d.cur[threadID()] = c
	return c, nil
}

// CtxDestroy is cuCtxDestroy_v2. Destroying a primary context or an unknown
// one fails with CUDA_ERROR_INVALID_CONTEXT.
func (d *Driver) CtxDestroy(ctx cudadrv.Context) error {
	const op = "cuCtxDestroy_v2"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.contexts[ctx]; !ok {
		return errorWhy(op, cudadrv.ErrorInvalidContext, "context %#x not created by CtxCreate or already destroyed", uintptr(ctx))
	}
	delete(d.contexts, ctx)
	d.uncurrent(ctx)
	return nil
}

// CtxSetCurrent is cuCtxSetCurrent: ctx becomes current on the calling OS
// thread (0 unsets it there). A goroutine that is not locked to its thread
// (runtime.LockOSThread) may find it gone on its next call, as with CUDA.
func (d *Driver) CtxSetCurrent(ctx cudadrv.Context) error {
	const op = "cuCtxSetCurrent"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if ctx != 0 {
		if _, ok := d.contexts[ctx]; !ok {
			dev := d.primaryDevice(ctx)
			if dev < 0 || d.devs[dev].primary == 0 {
				return errorWhy(op, cudadrv.ErrorInvalidContext, "context %#x unknown, destroyed or a released primary context", uintptr(ctx))
			}
		}
	}
	if ctx == 0 {
		delete(d.cur, threadID())
	} else {
		d.cur[threadID()] = ctx
	}
	return nil
}

// CtxGetCurrent is cuCtxGetCurrent: the context current on the calling OS
// thread, 0 when none is.
func (d *Driver) CtxGetCurrent() (cudadrv.Context, error) {
	if _, err := d.begin("cuCtxGetCurrent"); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cur[threadID()], nil
}

// uncurrent makes a destroyed or released context current nowhere. d.mu must be held.
func (d *Driver) uncurrent(ctx cudadrv.Context) {
	for tid, c := range d.cur {
		if c == ctx {
			delete(d.cur, tid)
		}
	}
}

// ctxDevice returns the device of a live context.
func (d *Driver) ctxDevice(c cudadrv.Context) (cudadrv.Device, bool) {
	if dev, ok := d.contexts[c]; ok {
		return dev, true
	}
	if dev := d.primaryDevice(c); dev >= 0 && d.devs[dev].primary > 0 {
		return dev, true
	}
	return 0, false
}

// needCtx returns the context current on the calling OS thread and its
// device, for a call that works in the current context; without one it
// fails with CUDA_ERROR_INVALID_CONTEXT. d.mu must be held.
func (d *Driver) needCtx(op string) (cudadrv.Context, cudadrv.Device, error) {
	c := d.cur[threadID()]
	if c == 0 {
		return 0, 0, errorWhy(op, cudadrv.ErrorInvalidContext, "no context is current on the calling OS thread %d (make one current with cuCtxSetCurrent from a goroutine locked to its thread)", threadID())
	}
	dev, ok := d.ctxDevice(c)
	if !ok {
		return 0, 0, errorWhy(op, cudadrv.ErrorInvalidContext, "the current context %#x is destroyed or released", uintptr(c))
	}
	if err := d.stuck(op, c); err != nil {
		return 0, 0, err
	}
	return c, dev, nil
}

// MemGetInfo is cuMemGetInfo_v2 for the current device: free is its
// allocation limit less what is allocated.
func (d *Driver) MemGetInfo() (free, total uint64, err error) {
	const op = "cuMemGetInfo_v2"
	if _, err := d.begin(op); err != nil {
		return 0, 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.devs) == 0 {
		return 0, 0, errorWhy(op, cudadrv.ErrorNoDevice, "no devices")
	}
	_, dev, err := d.needCtx(op)
	if err != nil {
		return 0, 0, err
	}
	dv := d.devs[dev]
	if dv.used < dv.limit {
		free = dv.limit - dv.used
	}
	return free, dv.spec.TotalMem, nil
}

// ---- modules and kernels ----

// KernelFunc is the Go body of a fake kernel. It runs in stream order with
// the driver's lock held: it must not call the driver's methods, but may use
// k.Mem to reach device memory. An error fails the launch asynchronously
// (CUDA_ERROR_LAUNCH_FAILED at the next synchronization).
type KernelFunc func(k *KernelCall) error

// KernelCall is one launch of a fake kernel.
type KernelCall struct {
	Name      string
	Grid      [3]uint32
	Block     [3]uint32
	SharedMem uint32
	Stream    cudadrv.Stream
	// Args are copies of the kernel arguments taken at launch, sized as
	// given to RegisterKernel.
	Args [][]byte
	d    *Driver
}

// Arg returns argument i, or nil when there is no such argument.
func (k *KernelCall) Arg(i int) []byte {
	if i < 0 || i >= len(k.Args) {
		return nil
	}
	return k.Args[i]
}

// Uint64 returns argument i read as a little-endian integer of up to 8 bytes (0 when absent).
func (k *KernelCall) Uint64(i int) uint64 {
	var v uint64
	for j, b := range k.Arg(i) {
		if j == 8 {
			break
		}
		v |= uint64(b) << (8 * j)
	}
	return v
}

// Uint32 returns argument i read as a little-endian uint32 (0 when absent).
func (k *KernelCall) Uint32(i int) uint32 { return uint32(k.Uint64(i)) }

// Ptr returns argument i read as a device pointer (0 when absent).
func (k *KernelCall) Ptr(i int) cudadrv.DevicePtr { return cudadrv.DevicePtr(k.Uint64(i)) }

// Mem returns the n bytes of device memory (or mapped host memory) at p,
// or an error when they are not all allocated. Mapped host memory may run
// on from one pinned range into the next one that starts where it ends
// (registrations one after the other), as a kernel on a GPU reaches every
// mapped page through its address; device memory must lie in one
// allocation. Call it only while the kernel function runs.
func (k *KernelCall) Mem(p cudadrv.DevicePtr, n uint64) ([]byte, error) {
	r, err := k.d.resolveDev("kernel "+k.Name, p, n)
	if err != nil {
		if b, ok := k.d.mappedSpan(p, n); ok {
			return b, nil
		}
		return nil, err
	}
	return r.bytes(n)
}

type kernel struct {
	name     string
	argSizes []int
	fn       KernelFunc
}

type module struct {
	h     cudadrv.Module
	funcs []cudadrv.Function
}

type function struct {
	h    cudadrv.Function
	mod  *module
	name string // the kernel's name: a launch runs the body registered for it then
}

// RegisterKernel makes name resolvable by ModuleGetFunction in every module
// loaded from now on or earlier. argSizes gives the size in bytes of each
// kernel argument; LaunchKernel copies that many bytes of each from its
// parameter array. fn may be nil for a kernel that does nothing.
// Registering a name again replaces the kernel for every launch from then
// on, of functions looked up before as well as after.
func (d *Driver) RegisterKernel(name string, argSizes []int, fn KernelFunc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.kernels[name] = &kernel{name: name, argSizes: slices.Clone(argSizes), fn: fn}
}

// ModuleLoadData is cuModuleLoadData. It accepts PTX-like text (starting,
// after white space, with "//" or ".version") and ELF images; an empty
// image is CUDA_ERROR_INVALID_VALUE, anything else CUDA_ERROR_INVALID_IMAGE.
func (d *Driver) ModuleLoadData(image []byte) (cudadrv.Module, error) {
	const op = "cuModuleLoadData"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	if len(image) == 0 {
		return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "empty image")
	}
	text := strings.TrimLeft(string(image[:min(len(image), 256)]), " \t\r\n")
	if !strings.HasPrefix(text, "//") && !strings.HasPrefix(text, ".version") && !strings.HasPrefix(text, "\x7fELF") {
		return 0, errorWhy(op, cudadrv.ErrorInvalidImage, "image is neither PTX text nor ELF")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, _, err := d.needCtx(op); err != nil {
		return 0, err
	}
	d.nextMod += 0x10
	m := &module{h: cudadrv.Module(d.nextMod)}
	d.modules[m.h] = m
	return m.h, nil
}

// ModuleUnload is cuModuleUnload; the module's functions become invalid.
func (d *Driver) ModuleUnload(m cudadrv.Module) error {
	const op = "cuModuleUnload"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	mod, ok := d.modules[m]
	if !ok {
		return errorWhy(op, cudadrv.ErrorInvalidHandle, "module %#x unknown or unloaded", uintptr(m))
	}
	for _, f := range mod.funcs {
		delete(d.funcs, f)
	}
	delete(d.modules, m)
	return nil
}

// ModuleGetFunction is cuModuleGetFunction: names registered with
// RegisterKernel resolve, others fail with CUDA_ERROR_NOT_FOUND.
func (d *Driver) ModuleGetFunction(m cudadrv.Module, name string) (cudadrv.Function, error) {
	const op = "cuModuleGetFunction"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	mod, ok := d.modules[m]
	if !ok {
		return 0, errorWhy(op, cudadrv.ErrorInvalidHandle, "module %#x unknown or unloaded", uintptr(m))
	}
	if _, ok := d.kernels[name]; !ok {
		return 0, errorWhy(op, cudadrv.ErrorNotFound, "no kernel %q registered", name)
	}
	for _, fh := range mod.funcs {
		if d.funcs[fh].name == name {
			return fh, nil
		}
	}
	d.nextFunc += 0x10
	f := &function{h: cudadrv.Function(d.nextFunc), mod: mod, name: name}
	d.funcs[f.h] = f
	mod.funcs = append(mod.funcs, f.h)
	return f.h, nil
}

// LaunchKernel is cuLaunchKernel. It checks the launch configuration,
// copies the arguments (sizes from RegisterKernel) and queues the kernel's
// Go function on s.
func (d *Driver) LaunchKernel(f cudadrv.Function, grid, block [3]uint32, sharedMem uint32, s cudadrv.Stream, params unsafe.Pointer) error {
	const op = "cuLaunchKernel"
	fail, err := d.begin(op)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.refund(&fail)
	fn, ok := d.funcs[f]
	if !ok {
		return errorWhy(op, cudadrv.ErrorInvalidHandle, "function %#x unknown or its module unloaded", uintptr(f))
	}
	st, err := d.streamOf(op, s)
	if err != nil {
		return err
	}
	for i := range 3 {
		if grid[i] == 0 || block[i] == 0 {
			return errorWhy(op, cudadrv.ErrorInvalidValue, "grid %v block %v has a zero dimension", grid, block)
		}
	}
	if uint64(block[0])*uint64(block[1])*uint64(block[2]) > 1024 || block[2] > 64 {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "block %v exceeds 1024 threads", block)
	}
	if sharedMem > 228<<10 {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "shared memory %d bytes", sharedMem)
	}
	k := d.kernels[fn.name]
	call := &KernelCall{Name: k.name, Grid: grid, Block: block, SharedMem: sharedMem, Stream: s, d: d}
	if n := len(k.argSizes); n > 0 {
		if params == nil {
			return errorWhy(op, cudadrv.ErrorInvalidValue, "kernel %s takes %d arguments, params is nil", k.name, n)
		}
		ptrs := unsafe.Slice((*unsafe.Pointer)(params), n)
		for i, sz := range k.argSizes {
			if ptrs[i] == nil {
				return errorWhy(op, cudadrv.ErrorInvalidValue, "kernel %s argument %d is a nil pointer", k.name, i)
			}
			call.Args = append(call.Args, slices.Clone(unsafe.Slice((*byte)(ptrs[i]), sz)))
		}
	}
	fail.r = nil
	d.enqueue(st, op, fail, func() (err error) {
		if k.fn == nil {
			return nil
		}
		// A body that panics fails its launch, as a kernel that traps
		// does: the panic must not unwind through whichever call runs the
		// work (a release, another goroutine's synchronize) and leave the
		// work started but never done, its waiters blocked for good.
		defer func() {
			if r := recover(); r != nil {
				err = errorWhy(op, cudadrv.ErrorLaunchFailed, "kernel %s panicked: %v\n%s", k.name, r, debug.Stack())
			}
		}()
		if err := k.fn(call); err != nil {
			return errorWhy(op, cudadrv.ErrorLaunchFailed, "kernel %s: %v", k.name, err)
		}
		return nil
	})
	return nil
}
