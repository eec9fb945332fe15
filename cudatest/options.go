package cudatest

import (
	"fmt"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
)

// Option configures the fake driver Install or Start creates. Options only
// record their values; Install and Start check them and report the first
// invalid one, naming it.
type Option func(*config)

type config struct {
	count      int
	countSet   bool
	specs      []DeviceSpec
	version    int
	versionSet bool
	timeout    time.Duration
	timeoutSet bool
	noLeaks    bool
}

// DeviceSpec describes one fake device. The zero value is the default
// device: a discrete GPU of compute capability 9.0 named "Fake NVIDIA
// H200" with 16 GiB of memory, unified addressing, host mapping, host
// registration and two copy engines.
type DeviceSpec struct {
	// Name is what cuda.Device.Name reports; "" means the default name.
	Name string
	// Memory is the device memory in bytes, what cuda.Context.MemInfo
	// reports as total; allocations beyond it fail with
	// CUDA_ERROR_OUT_OF_MEMORY. 0 means 16 GiB.
	Memory uint64
	// PCIBusID is the PCI address, e.g. "0000:18:00.0"; "" means one derived
	// from the ordinal.
	PCIBusID string
	// Attributes override attributes of the default device: for example
	// cuda.AttrIntegrated: 1 for an integrated GPU, or
	// cuda.AttrCanMapHostMemory: 0 for a device without mapped pinned memory.
	// Attributes the default device lacks read as 0.
	Attributes map[cuda.Attribute]int
}

// WithDevices makes n default devices (one without this option). WithDevices(0)
// makes a driver that reports no device, as on a machine whose GPU is
// missing or hidden. It cannot be combined with WithDevice.
func WithDevices(n int) Option {
	return func(c *config) { c.count, c.countSet = n, true }
}

// WithDevice adds a device described by spec. With one or more WithDevice options
// the fake has exactly those devices, in order.
func WithDevice(spec DeviceSpec) Option {
	return func(c *config) { c.specs = append(c.specs, spec) }
}

// WithDriverVersion sets what cuda.DriverVersion reports, as major*1000 +
// minor*10 (12040 for CUDA 12.4); the default is 13000.
func WithDriverVersion(v int) Option {
	return func(c *config) { c.version, c.versionSet = v, true }
}

// WithWaitTimeout bounds how long a synchronizing driver call blocks on work
// that a hold keeps from running (see Driver.HoldStream) before it fails
// with CUDA_ERROR_LAUNCH_TIMEOUT, so that a test of a hung GPU ends instead
// of hanging. The default is 20 seconds; 0 means no bound: the call waits
// until the work is released, as on a GPU.
func WithWaitTimeout(d time.Duration) Option {
	return func(c *config) { c.timeout, c.timeoutSet = d, true }
}

// WithoutLeakCheck turns off the leak check Install runs at cleanup, for a
// test that leaves objects behind on purpose. Leaks still works.
func WithoutLeakCheck() Option {
	return func(c *config) { c.noLeaks = true }
}

// maxAttribute is the largest CUdevice_attribute number the fake accepts.
const maxAttribute = 200

func invalid(format string, args ...any) error {
	return fmt.Errorf("cudatest: "+format+": %w", append(args, cuda.ErrInvalidValue)...)
}

// build checks the options and turns them into the fake's.
func build(opts []Option) (config, fakedrv.Options, error) {
	var c config
	for _, o := range opts {
		if o == nil {
			return c, fakedrv.Options{}, invalid("nil Option")
		}
		o(&c)
	}
	var fo fakedrv.Options
	switch {
	case c.countSet && len(c.specs) > 0:
		return c, fo, invalid("WithDevices(%d) and WithDevice cannot be combined", c.count)
	case c.countSet && c.count < 0:
		return c, fo, invalid("WithDevices(%d): the count must not be negative", c.count)
	case c.countSet && c.count > 64:
		return c, fo, invalid("WithDevices(%d): at most 64 devices", c.count)
	case c.countSet:
		fo.Devices = make([]fakedrv.DeviceSpec, c.count)
	}
	for i, s := range c.specs {
		fs := fakedrv.DeviceSpec{Name: s.Name, TotalMem: s.Memory, PCIBusID: s.PCIBusID}
		for a, v := range s.Attributes {
			if a <= 0 || a > maxAttribute {
				return c, fo, invalid("WithDevice #%d: attribute %d is not a CUdevice_attribute", i, a)
			}
			if fs.Attrs == nil {
				fs.Attrs = map[cudadrv.DeviceAttribute]int{}
			}
			fs.Attrs[cudadrv.DeviceAttribute(a)] = v
		}
		fo.Devices = append(fo.Devices, fs)
	}
	if c.versionSet {
		if c.version <= 0 {
			return c, fo, invalid("WithDriverVersion(%d): the version must be positive", c.version)
		}
		fo.DriverVersion = c.version
	}
	if c.timeoutSet {
		switch {
		case c.timeout < 0:
			return c, fo, invalid("WithWaitTimeout(%v): the timeout must not be negative", c.timeout)
		case c.timeout == 0:
			fo.WaitTimeout = -1 // the fake's "forever"
		default:
			fo.WaitTimeout = c.timeout
		}
	}
	return c, fo, nil
}
