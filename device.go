package pinmem

import (
	"fmt"
	"sync"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudaerr"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/sysinfo"
)

// caps are the device attributes that decide how host memory is pinned.
type caps struct {
	integrated   bool // shares memory with the host (Jetson/Tegra)
	canMap       bool // CanMapHostMemory
	hostRegister bool // HostRegisterSupported
	readOnlyReg  bool // ReadOnlyHostRegisterSupported
}

// target is where memory is pinned: a device, the driver, its primary context.
type target struct {
	dev  *cuda.Device
	drv  binding
	ctx  cudadrv.Context
	caps caps
}

// binding is the one place this package calls the driver binding: the
// calls that pin, map and unpin host memory. Their failures come back as
// package cuda's error types, as cuda's own calls return them, so that
// errors.As finds a *cuda.Error in any error of pinmem.
type binding struct{ d cudadrv.Driver }

func (b binding) MemHostAlloc(size uint64, flags uint32) (hostptr.Ptr, error) {
	p, err := b.d.MemHostAlloc(size, flags)
	return p, cudaerr.Public(err)
}

func (b binding) MemFreeHost(p hostptr.Ptr) error { return cudaerr.Public(b.d.MemFreeHost(p)) }

func (b binding) MemHostRegister(p hostptr.Ptr, size uint64, flags uint32) error {
	return cudaerr.Public(b.d.MemHostRegister(p, size, flags))
}

func (b binding) MemHostUnregister(p hostptr.Ptr) error {
	return cudaerr.Public(b.d.MemHostUnregister(p))
}

func (b binding) MemHostGetDevicePointer(p hostptr.Ptr, flags uint32) (cudadrv.DevicePtr, error) {
	dp, err := b.d.MemHostGetDevicePointer(p, flags)
	return dp, cudaerr.Public(err)
}

// deviceCaps reads dev's capabilities from its properties. Package cuda
// reads the attributes, applies the one fallback policy for attributes an
// older driver lacks and caches the result; a read that failed is an error
// here, never a guess: a guess cached after a transient failure would
// refuse Mapped or Register for good.
func deviceCaps(dev *cuda.Device) (caps, error) {
	p, err := dev.Properties()
	if err != nil {
		return caps{}, fmt.Errorf("pinmem: properties of %v: %w", dev, err)
	}
	return caps{
		integrated:   p.Integrated,
		canMap:       p.CanMapHostMemory,
		hostRegister: p.HostRegisterSupported,
		readOnlyReg:  p.ReadOnlyHostRegisterSupported,
	}, nil
}

// resolve finds the driver, the device (default 0) and its primary context.
func resolve(o options) (target, error) {
	drv, err := cudadrv.Get()
	if err != nil {
		return target{}, fmt.Errorf("pinmem: %w", cudaerr.Public(err))
	}
	dev := o.Dev
	if dev == nil {
		if dev, err = cuda.GetDevice(0); err != nil {
			return target{}, fmt.Errorf("pinmem: %w", err)
		}
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		return target{}, fmt.Errorf("pinmem: primary context of %v: %w", dev, err)
	}
	c, err := deviceCaps(dev)
	if err != nil {
		return target{}, err
	}
	return target{dev: dev, drv: binding{drv}, ctx: cudadrv.Context(ctx.Handle()), caps: c}, nil
}

// do runs fn on a locked OS thread with the target's primary context current.
func (t target) do(fn func() error) error {
	return cudaerr.Public(cudadrv.With(t.drv.d, t.ctx, fn))
}

var (
	thpOnce sync.Once
	thpOK   bool
)

// thpAvailable reports whether the kernel offers transparent huge pages to
// mappings that ask for them (mode "always" or "madvise").
func thpAvailable() bool {
	thpOnce.Do(func() {
		t, err := sysinfo.Reader{}.THP()
		thpOK = t != nil && (t.Enabled == "always" || t.Enabled == "madvise") && (err == nil || t.Enabled != "")
	})
	return thpOK
}
