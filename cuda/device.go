package cuda

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pinmem/pinmem/internal/cudadrv"
)

// driver returns the process's driver or an error matching ErrNoDriver/ErrNoDevice.
func driver() (cudadrv.Driver, error) { return pub2(cudadrv.Get()) }

// DriverVersion returns the CUDA version the installed driver supports,
// as major*1000 + minor*10 (13000 for CUDA 13.0).
func DriverVersion() (int, error) {
	d, err := driver()
	if err != nil {
		return 0, err
	}
	return pub2(d.DriverGetVersion())
}

// DeviceCount returns the number of CUDA devices.
func DeviceCount() (int, error) {
	d, err := driver()
	if err != nil {
		return 0, err
	}
	return pub2(d.DeviceGetCount())
}

var (
	devMu   sync.Mutex
	devices = map[devKey]*Device{}
)

type devKey struct {
	drv     cudadrv.Driver
	ordinal int
}

// Device is one GPU. Devices are shared: GetDevice returns the same *Device
// for the same ordinal.
type Device struct {
	drv     cudadrv.Driver
	ordinal int
	dev     cudadrv.Device

	ctxMu sync.Mutex              // serialises retaining the primary context
	ctx   atomic.Pointer[Context] // the primary context once retained
	props atomic.Pointer[Properties]
}

// GetDevice returns the device with the given ordinal (0-based).
func GetDevice(ordinal int) (*Device, error) {
	d, err := driver()
	if err != nil {
		return nil, err
	}
	n, err := pub2(d.DeviceGetCount())
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("cuda: the driver reports no devices: %w", ErrNoDevice)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: device ordinal %d out of range [0,%d): %w", ordinal, n, ErrInvalidValue)
	}
	devMu.Lock()
	defer devMu.Unlock()
	k := devKey{d, ordinal}
	if dev, ok := devices[k]; ok {
		return dev, nil
	}
	h, err := pub2(d.DeviceGet(ordinal))
	if err != nil {
		return nil, err
	}
	dev := &Device{drv: d, ordinal: ordinal, dev: h}
	devices[k] = dev
	return dev, nil
}

// Ordinal returns the device's index among the process's CUDA devices (-1
// for a nil Device).
func (d *Device) Ordinal() int {
	if d == nil {
		return -1
	}
	return d.ordinal
}

// Name returns the device's marketing name, e.g. "NVIDIA H200".
func (d *Device) Name() (string, error) {
	if d == nil {
		return "", errNilDevice
	}
	return pub2(d.drv.DeviceGetName(d.dev))
}

// Attribute is a CUdevice_attribute: one integer property of a device.
// The constants below are those pinmem reads; any other value of cuda.h
// may be passed to Device.Attribute as well.
type Attribute int32

// Device attributes, with the values of cuda.h.
const (
	AttrMaxThreadsPerBlock                     Attribute = 1
	AttrClockRate                              Attribute = 13 // kHz
	AttrMultiprocessorCount                    Attribute = 16
	AttrIntegrated                             Attribute = 18 // shares memory with the host
	AttrCanMapHostMemory                       Attribute = 19 // mapped (zero-copy) host memory works
	AttrComputeMode                            Attribute = 20
	AttrPCIBusID                               Attribute = 33
	AttrPCIDeviceID                            Attribute = 34
	AttrMemoryClockRate                        Attribute = 36 // kHz
	AttrGlobalMemoryBusWidth                   Attribute = 37 // bits
	AttrAsyncEngineCount                       Attribute = 40 // copy engines
	AttrUnifiedAddressing                      Attribute = 41
	AttrPCIDomainID                            Attribute = 50
	AttrComputeCapabilityMajor                 Attribute = 75
	AttrComputeCapabilityMinor                 Attribute = 76
	AttrManagedMemory                          Attribute = 83
	AttrPageableMemoryAccess                   Attribute = 88
	AttrConcurrentManagedAccess                Attribute = 89
	AttrCanUseHostPointerForRegisteredMem      Attribute = 91
	AttrHostRegisterSupported                  Attribute = 99
	AttrPageableMemoryAccessUsesHostPageTables Attribute = 100
	AttrReadOnlyHostRegisterSupported          Attribute = 113
	AttrNUMAConfig                             Attribute = 130
	AttrNUMAID                                 Attribute = 131
	AttrHostNUMAID                             Attribute = 134
)

// Attribute returns one raw device attribute.
func (d *Device) Attribute(a Attribute) (int, error) {
	if d == nil {
		return 0, errNilDevice
	}
	return pub2(d.drv.DeviceGetAttribute(cudadrv.DeviceAttribute(a), d.dev))
}

// PrimaryContext returns the device's primary context, retained once for
// the life of the process (as the CUDA runtime does), so it is shared with
// any runtime-API code in the same process. A failed retain is not
// remembered: the next call tries again.
func (d *Device) PrimaryContext() (*Context, error) {
	if d == nil {
		return nil, errNilDevice
	}
	if c := d.ctx.Load(); c != nil {
		return c, nil
	}
	d.ctxMu.Lock()
	defer d.ctxMu.Unlock()
	if c := d.ctx.Load(); c != nil {
		return c, nil
	}
	h, err := pub2(d.drv.DevicePrimaryCtxRetain(d.dev))
	if err != nil {
		return nil, fmt.Errorf("cuda: retaining the primary context of %v: %w", d, err)
	}
	c := &Context{drv: d.drv, h: h, dev: d, kind: ctxPrimary}
	d.ctx.Store(c)
	return c, nil
}

// Properties are the attributes of a device that matter for host memory
// and transfers.
type Properties struct {
	Ordinal                       int
	Name                          string
	ComputeMajor, ComputeMinor    int  // compute capability
	Multiprocessors               int  // SM count
	AsyncEngines                  int  // copy engines that run concurrently with kernels
	CanMapHostMemory              bool // mapped (zero-copy) host memory is possible
	Integrated                    bool // shares memory with the host (Jetson/Tegra)
	UnifiedAddressing             bool // host and device share one virtual address space
	HostRegisterSupported         bool // cuMemHostRegister works
	ReadOnlyHostRegisterSupported bool // read-only registration works
	PageableMemoryAccess          bool // the GPU can access pageable memory coherently (HMM/ATS)
	PageableUsesHostPageTables    bool // pageable access goes through the host page tables (ATS)
	CanUseHostPointerForRegMem    bool // registered memory has the same address on the device
	ConcurrentManagedAccess       bool
	PCIBusID                      string // as the driver prints it, e.g. "00000000:1B:00.0"
	TotalMemory                   uint64 // bytes of device memory
	ClockRateKHz                  int
	MemoryClockKHz                int
	MemoryBusWidth                int // bits
	NUMAID                        int // the device's own NUMA node when it is one, else -1
	HostNUMAID                    int // the host NUMA node nearest to the device, or -1
}

// Properties returns the device's properties, read from the driver on the
// first successful call and cached for the life of the process (they do
// not change while it runs).
//
// Fallback policy: an attribute that the installed driver's CUDA version
// defines must be read; if any read fails, Properties returns that error,
// caches nothing, and the next call reads again, so a transient failure
// never becomes a permanent wrong answer. An attribute newer than the
// driver is not asked for and keeps its zero value:
// ReadOnlyHostRegisterSupported before CUDA 11.1. The NUMA attributes
// (CUDA 12.2 and later) are placement hints: a driver that rejects them as
// an invalid value does not know them, and NUMAID and HostNUMAID are -1.
func (d *Device) Properties() (Properties, error) {
	if d == nil {
		return Properties{Ordinal: -1, NUMAID: -1, HostNUMAID: -1}, errNilDevice
	}
	if p := d.props.Load(); p != nil {
		return *p, nil
	}
	p, err := d.readProperties()
	if err != nil {
		return p, fmt.Errorf("cuda: properties of %v: %w", d, err)
	}
	d.props.Store(&p)
	return p, nil
}

// readProperties reads every property from the driver.
func (d *Device) readProperties() (Properties, error) {
	p := Properties{Ordinal: d.ordinal, NUMAID: -1, HostNUMAID: -1}
	var err error
	if p.Name, err = d.Name(); err != nil {
		return p, err
	}
	if p.TotalMemory, err = pub2(d.drv.DeviceTotalMem(d.dev)); err != nil {
		return p, err
	}
	if p.PCIBusID, err = pub2(d.drv.DeviceGetPCIBusID(d.dev)); err != nil {
		return p, err
	}
	ints := []struct {
		a Attribute
		v *int
	}{
		{AttrComputeCapabilityMajor, &p.ComputeMajor},
		{AttrComputeCapabilityMinor, &p.ComputeMinor},
		{AttrMultiprocessorCount, &p.Multiprocessors},
		{AttrAsyncEngineCount, &p.AsyncEngines},
		{AttrClockRate, &p.ClockRateKHz},
		{AttrMemoryClockRate, &p.MemoryClockKHz},
		{AttrGlobalMemoryBusWidth, &p.MemoryBusWidth},
	}
	for _, a := range ints {
		if *a.v, err = d.Attribute(a.a); err != nil {
			return p, err
		}
	}
	bools := []struct {
		a Attribute
		v *bool
	}{
		{AttrCanMapHostMemory, &p.CanMapHostMemory},
		{AttrIntegrated, &p.Integrated},
		{AttrUnifiedAddressing, &p.UnifiedAddressing},
		{AttrHostRegisterSupported, &p.HostRegisterSupported},
		{AttrReadOnlyHostRegisterSupported, &p.ReadOnlyHostRegisterSupported},
		{AttrPageableMemoryAccess, &p.PageableMemoryAccess},
		{AttrPageableMemoryAccessUsesHostPageTables, &p.PageableUsesHostPageTables},
		{AttrCanUseHostPointerForRegisteredMem, &p.CanUseHostPointerForRegMem},
		{AttrConcurrentManagedAccess, &p.ConcurrentManagedAccess},
	}
	version, err := pub2(d.drv.DriverGetVersion())
	if err != nil {
		return p, err
	}
	for _, a := range bools {
		if a.a == AttrReadOnlyHostRegisterSupported && version < 11010 {
			continue // CUDA 11.1 introduced it
		}
		v, err := d.Attribute(a.a)
		if err != nil {
			return p, err
		}
		*a.v = v != 0
	}
	// NUMA attributes are CUDA 12.2+; an older driver rejects them as an
	// invalid value, which leaves the ids at -1. Any other failure fails.
	cfg, err := d.optionalAttribute(AttrNUMAConfig)
	if err != nil {
		return p, err
	}
	if cfg > 0 {
		if p.NUMAID, err = d.optionalAttribute(AttrNUMAID); err != nil {
			return p, err
		}
	}
	if p.HostNUMAID, err = d.optionalAttribute(AttrHostNUMAID); err != nil {
		return p, err
	}
	return p, nil
}

// optionalAttribute reads an attribute that an older driver may not know:
// -1 when the driver rejects it as an invalid value.
func (d *Device) optionalAttribute(a Attribute) (int, error) {
	v, err := d.Attribute(a)
	if errors.Is(err, ErrInvalidValue) {
		return -1, nil
	}
	return v, err
}

// errNilDevice is the error of a method called on a nil *Device.
var errNilDevice = fmt.Errorf("cuda: nil device: %w", ErrInvalidValue)

// String names the device, e.g. "cuda device 0".
func (d *Device) String() string {
	if d == nil {
		return "cuda device <nil>"
	}
	return fmt.Sprintf("cuda device %d", d.ordinal)
}
