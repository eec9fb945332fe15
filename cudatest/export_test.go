package cudatest

import "github.com/pinmem/pinmem/internal/cudadrv/fakedrv"

// Test access to the fake's state.

// Objects counts the driver objects live in the fake.
type Objects struct {
	Streams         int    // streams created and not destroyed
	Events          int    // events created and not destroyed
	Modules         int    // modules loaded and not unloaded
	Contexts        int    // contexts created (cuda.NewContext) and not destroyed; primary contexts are not counted
	DeviceAllocs    int    // device memory allocations not freed
	DeviceBytes     uint64 // their bytes
	PinnedAllocs    int    // pinned host allocations (cuMemHostAlloc) not freed
	PinnedBytes     uint64 // their bytes
	Registrations   int    // host ranges registered (cuMemHostRegister) and not unregistered
	RegisteredBytes uint64 // their bytes
	PendingOps      int    // queued asynchronous operations that have not run (held, or waiting for held work)
}

// Live returns the objects live in the fake now.
func (d *Driver) Live() Objects {
	if d == nil {
		return Objects{}
	}
	c := d.fake.Live()
	return Objects{
		Streams: c.Streams, Events: c.Events, Modules: c.Modules, Contexts: c.Contexts,
		DeviceAllocs: c.DeviceAllocs, DeviceBytes: c.DeviceBytes,
		PinnedAllocs: c.HostAllocs, PinnedBytes: c.HostAllocBytes,
		Registrations: c.Registrations, RegisteredBytes: c.RegisteredBytes,
		PendingOps: c.PendingOps,
	}
}

// Ops returns, sorted, the driver functions the fake implements, by the
// names FailOn, FailAsync and Calls take: the CUDA driver API symbols as
// libcuda exports them, e.g. "cuMemAlloc_v2", "cuMemHostAlloc",
// "cuStreamCreate", "cuMemcpyHtoDAsync_v2". Those functions also take the
// operation classes AnyHtoD, AnyDtoH, AnyLaunch and AnyAlloc.
func Ops() []string { return fakedrv.Ops() }
