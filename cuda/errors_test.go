package cuda_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// Driver failures reach users as *cuda.Error through errors.As, whether
// they come through package cuda or through pinmem, which calls the
// binding directly; wrapped, they still match their sentinel. Each package
// converts where it calls the binding: there is no hook.
func TestErrorAsFromEveryPackage(t *testing.T) {
	fd := testutil.UseFake(t, fakedrv.Options{})
	ctx := testutil.PrimaryContext(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	ev, err := ctx.NewEvent(cuda.EventDisableTiming)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	dev, err := ctx.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free()
	host := make([]byte, 64)
	cases := []struct {
		name string
		op   string
		code cudadrv.Result
		want error
		do   func() error
	}{
		{"cuda Alloc", "cuMemAlloc_v2", cudadrv.ErrorOutOfMemory, cuda.ErrOutOfMemory, func() error { _, err := ctx.Alloc(4096); return err }},
		{"cuda Stream.CopyHtoD", "cuMemcpyHtoDAsync_v2", cudadrv.ErrorInvalidValue, cuda.ErrInvalidValue, func() error { return s.CopyHtoD(dev, 0, host) }},
		{"cuda Event.Record", "cuEventRecord", cudadrv.ErrorLaunchFailed, cuda.ErrLaunchFailed, func() error { return ev.Record(s) }},
		{"cuda DeviceBuffer.ReadAt", "cuMemcpyDtoH_v2", cudadrv.ErrorIllegalAddress, cuda.ErrLaunchFailed, func() error { _, err := dev.ReadAt(host, 0); return err }},
		{"cuda NewStream", "cuStreamCreate", cudadrv.ErrorOutOfMemory, cuda.ErrOutOfMemory, func() error { _, err := ctx.NewStream(0); return err }},
		{"pinmem Alloc", "cuMemHostAlloc", cudadrv.ErrorOutOfMemory, cuda.ErrOutOfMemory, func() error {
			b, err := pinmem.Alloc(1<<20, pinmem.WriteCombined)
			if err == nil {
				b.Free()
			}
			return err
		}},
		{"pinmem Register", "cuMemHostRegister_v2", cudadrv.ErrorNotPermitted, cuda.ErrNotSupported, func() error {
			b, err := pinmem.Register(make([]byte, 1<<20), 0)
			if err == nil {
				b.Free()
			}
			return err
		}},
	}
	for _, c := range cases {
		if err := fd.FailOn(c.op, -1, c.code); err != nil {
			t.Fatal(err)
		}
		err := c.do()
		fd.ClearFaults()
		err = fmt.Errorf("wrapped: %w", err)
		var de *cuda.Error
		if !errors.As(err, &de) {
			t.Errorf("%s: errors.As(*cuda.Error) fails on %v", c.name, err)
			continue
		}
		if de.Op != c.op || de.Code != cuda.Result(c.code) || de.Name == "" || de.Message == "" {
			t.Errorf("%s: got %+v, want op %s code %d with name and message", c.name, de, c.op, c.code)
		}
		if !errors.Is(err, c.want) || !errors.Is(de, c.want) {
			t.Errorf("%s: %v does not match %v", c.name, err, c.want)
		}
	}
}

// The binding's LoadError reaches users as *cuda.LoadError.
func TestLoadErrorAs(t *testing.T) {
	t.Setenv(cudadrv.EnvLibrary, filepath.Join(t.TempDir(), "nope.so"))
	defer cudadrv.Swap(nil)()
	_, err := cuda.DeviceCount()
	var le *cuda.LoadError
	if !errors.As(err, &le) || filepath.Base(le.Path) != "nope.so" || le.Symbol != "" || le.Err == nil {
		t.Fatalf("errors.As(*cuda.LoadError) on %v: %+v", err, le)
	}
	if !errors.Is(err, cuda.ErrNoDriver) || !errors.Is(le, cuda.ErrNoDriver) || errors.Is(le, cuda.ErrNotSupported) {
		t.Errorf("%v does not match ErrNoDriver alone", err)
	}
	missing := &cuda.LoadError{Path: "libcuda.so.1", Symbol: "cuX", Err: cuda.ErrNotSupported}
	if !errors.Is(missing, cuda.ErrNotSupported) || errors.Is(missing, cuda.ErrNoDriver) || missing.Error() == "" {
		t.Errorf("missing symbol %v", missing)
	}
}

// The public constants carry the driver's values.
func TestPublicConstantsMatchDriver(t *testing.T) {
	results := map[cuda.Result]cudadrv.Result{
		cuda.ResultSuccess: cudadrv.Success, cuda.ResultInvalidValue: cudadrv.ErrorInvalidValue,
		cuda.ResultOutOfMemory: cudadrv.ErrorOutOfMemory, cuda.ResultNotInitialized: cudadrv.ErrorNotInitialized,
		cuda.ResultDeinitialized: cudadrv.ErrorDeinitialized, cuda.ResultStubLibrary: cudadrv.ErrorStubLibrary,
		cuda.ResultNoDevice: cudadrv.ErrorNoDevice, cuda.ResultInvalidDevice: cudadrv.ErrorInvalidDevice,
		cuda.ResultInvalidImage: cudadrv.ErrorInvalidImage, cuda.ResultInvalidContext: cudadrv.ErrorInvalidContext,
		cuda.ResultNoBinaryForGPU: cudadrv.ErrorNoBinaryForGPU, cuda.ResultNotMapped: cudadrv.ErrorNotMapped,
		cuda.ResultInvalidPTX: cudadrv.ErrorInvalidPTX, cuda.ResultJITCompilerNotFound: cudadrv.ErrorJITCompilerNotFound,
		cuda.ResultUnsupportedPTXVersion: cudadrv.ErrorUnsupportedPTXVersion, cuda.ResultInvalidHandle: cudadrv.ErrorInvalidHandle,
		cuda.ResultNotFound: cudadrv.ErrorNotFound, cuda.ResultNotReady: cudadrv.ErrorNotReady,
		cuda.ResultIllegalAddress: cudadrv.ErrorIllegalAddress, cuda.ResultLaunchOutOfResources: cudadrv.ErrorLaunchOutOfResources,
		cuda.ResultLaunchTimeout: cudadrv.ErrorLaunchTimeout, cuda.ResultHostMemoryAlreadyRegistered: cudadrv.ErrorHostMemoryAlreadyRegistered,
		cuda.ResultHostMemoryNotRegistered: cudadrv.ErrorHostMemoryNotRegistered, cuda.ResultLaunchFailed: cudadrv.ErrorLaunchFailed,
		cuda.ResultNotPermitted: cudadrv.ErrorNotPermitted, cuda.ResultNotSupported: cudadrv.ErrorNotSupported,
		cuda.ResultSystemDriverMismatch: cudadrv.ErrorSystemDriverMismatch, cuda.ResultUnknown: cudadrv.ErrorUnknown,
	}
	for pub, drv := range results {
		if int32(pub) != int32(drv) {
			t.Errorf("cuda.Result %d is cudadrv %d", pub, drv)
		}
		e := &cuda.Error{Op: "cuTest", Code: pub}
		if s := cudadrv.Sentinel(drv); s != nil && !errors.Is(e, s) {
			t.Errorf("code %d does not match %v", pub, s)
		}
	}
	attrs := map[cuda.Attribute]cudadrv.DeviceAttribute{
		cuda.AttrMaxThreadsPerBlock: cudadrv.AttrMaxThreadsPerBlock, cuda.AttrClockRate: cudadrv.AttrClockRate,
		cuda.AttrMultiprocessorCount: cudadrv.AttrMultiprocessorCount, cuda.AttrIntegrated: cudadrv.AttrIntegrated,
		cuda.AttrCanMapHostMemory: cudadrv.AttrCanMapHostMemory, cuda.AttrComputeMode: cudadrv.AttrComputeMode,
		cuda.AttrPCIBusID: cudadrv.AttrPCIBusID, cuda.AttrPCIDeviceID: cudadrv.AttrPCIDeviceID,
		cuda.AttrMemoryClockRate: cudadrv.AttrMemoryClockRate, cuda.AttrGlobalMemoryBusWidth: cudadrv.AttrGlobalMemoryBusWidth,
		cuda.AttrAsyncEngineCount: cudadrv.AttrAsyncEngineCount, cuda.AttrUnifiedAddressing: cudadrv.AttrUnifiedAddressing,
		cuda.AttrPCIDomainID: cudadrv.AttrPCIDomainID, cuda.AttrComputeCapabilityMajor: cudadrv.AttrComputeCapabilityMajor,
		cuda.AttrComputeCapabilityMinor: cudadrv.AttrComputeCapabilityMinor, cuda.AttrManagedMemory: cudadrv.AttrManagedMemory,
		cuda.AttrPageableMemoryAccess: cudadrv.AttrPageableMemoryAccess, cuda.AttrConcurrentManagedAccess: cudadrv.AttrConcurrentManagedAccess,
		cuda.AttrCanUseHostPointerForRegisteredMem: cudadrv.AttrCanUseHostPointerForRegMem, cuda.AttrHostRegisterSupported: cudadrv.AttrHostRegisterSupported,
		cuda.AttrPageableMemoryAccessUsesHostPageTables: cudadrv.AttrPageableMemoryAccessUsesHostPageTables,
		cuda.AttrReadOnlyHostRegisterSupported:          cudadrv.AttrReadOnlyHostRegisterSupported,
		cuda.AttrNUMAConfig:                             cudadrv.AttrNUMAConfig, cuda.AttrNUMAID: cudadrv.AttrNUMAID, cuda.AttrHostNUMAID: cudadrv.AttrHostNUMAID,
	}
	if len(attrs) != 25 {
		t.Errorf("%d attributes mapped", len(attrs))
	}
	for pub, drv := range attrs {
		if int32(pub) != int32(drv) {
			t.Errorf("cuda.Attribute %d is cudadrv %d", pub, drv)
		}
	}
}

// The flag constants carry the driver's values.
func TestFlagConstantsMatchDriver(t *testing.T) {
	for pub, drv := range map[uint32]uint32{
		uint32(cuda.SchedAuto): cudadrv.CtxSchedAuto, uint32(cuda.SchedSpin): cudadrv.CtxSchedSpin,
		uint32(cuda.SchedYield): cudadrv.CtxSchedYield, uint32(cuda.SchedBlockingSync): cudadrv.CtxSchedBlockingSync,
		uint32(cuda.MapHost): cudadrv.CtxMapHost,
	} {
		if pub != drv {
			t.Errorf("context flag %#x is %#x in the driver", pub, drv)
		}
	}
	if uint32(cuda.StreamBlocking) != cudadrv.StreamDefault || uint32(cuda.StreamNonBlocking) != cudadrv.StreamNonBlocking {
		t.Error("stream flags differ from the driver's")
	}
	if uint32(cuda.EventDefault) != cudadrv.EventDefault || uint32(cuda.EventBlockingSync) != cudadrv.EventBlockingSync ||
		uint32(cuda.EventDisableTiming) != cudadrv.EventDisableTiming {
		t.Error("event flags differ from the driver's")
	}
}

// TestNotReadyWithoutAllocation: a poll of running work (cuEventQuery or
// cuStreamQuery answering CUDA_ERROR_NOT_READY) becomes a *cuda.Error
// with the code and operation, without an allocation per poll, while
// every other failure is a fresh *cuda.Error.
func TestNotReadyWithoutAllocation(t *testing.T) {
	for _, op := range []string{"cuEventQuery", "cuStreamQuery"} {
		in := &cudadrv.Error{Op: op, Code: cudadrv.ErrorNotReady, Name: "CUDA_ERROR_NOT_READY"}
		var ce *cuda.Error
		if err := cuda.Pub(in); !errors.As(err, &ce) || ce.Code != cuda.ResultNotReady || ce.Op != op {
			t.Fatalf("%s not ready: %#v", op, err)
		}
		if n := testing.AllocsPerRun(100, func() { _ = cuda.Pub(in) }); n != 0 {
			t.Errorf("%s not ready: %v allocations per conversion, want 0", op, n)
		}
	}
	in := &cudadrv.Error{Op: "cuMemcpyHtoDAsync_v2", Code: cudadrv.ErrorOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	a, b := cuda.Pub(in), cuda.Pub(in)
	if a == b || !errors.Is(a, cuda.ErrOutOfMemory) {
		t.Errorf("other failures: %v and %v, want two values matching ErrOutOfMemory", a, b)
	}
}
