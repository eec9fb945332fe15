package pinmem

import (
	"errors"
	"fmt"
	"sync"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/sysinfo"
)

var errorsIs = errors.Is

// caps are the device attributes that decide how host memory is pinned.
type caps struct {
	integrated    bool // shares memory with the host (Jetson/Tegra)
	canMap        bool // CanMapHostMemory
	hostRegister  bool // HostRegisterSupported
	readOnlyReg   bool // ReadOnlyHostRegisterSupported
	unified       bool // UnifiedAddressing
	hostPtrForReg bool // CanUseHostPointerForRegisteredMem
}

// target is where memory is pinned: a device, the driver, its primary context.
type target struct {
	dev  *cuda.Device
	drv  cudadrv.Driver
	ctx  cudadrv.Context
	caps caps
}

var capsCache sync.Map // *cuda.Device -> caps

func deviceCaps(dev *cuda.Device) caps {
	if c, ok := capsCache.Load(dev); ok {
		return c.(caps)
	}
	attr := func(a cuda.Attribute, dflt bool) bool {
		v, err := dev.Attribute(a)
		if err != nil {
			return dflt // an attribute an older driver does not know
		}
		return v != 0
	}
	c := caps{
		integrated:    attr(cuda.AttrIntegrated, false),
		canMap:        attr(cuda.AttrCanMapHostMemory, false),
		unified:       attr(cuda.AttrUnifiedAddressing, false),
		readOnlyReg:   attr(cuda.AttrReadOnlyHostRegisterSupported, false),
		hostPtrForReg: attr(cuda.AttrCanUseHostPointerForRegisteredMem, false),
	}
	// HostRegisterSupported is CUDA 9.2+; before it, only integrated devices lacked it.
	c.hostRegister = attr(cuda.AttrHostRegisterSupported, !c.integrated)
	capsCache.Store(dev, c)
	return c
}

// resolve finds the driver, the device (default 0) and its primary context.
func resolve(o options) (target, error) {
	drv, err := cudadrv.Get()
	if err != nil {
		return target{}, fmt.Errorf("pinmem: %w", err)
	}
	dev := o.dev
	if dev == nil {
		if dev, err = cuda.GetDevice(0); err != nil {
			return target{}, fmt.Errorf("pinmem: %w", err)
		}
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		return target{}, fmt.Errorf("pinmem: primary context of %v: %w", dev, err)
	}
	return target{dev: dev, drv: drv, ctx: cudadrv.Context(ctx.Handle()), caps: deviceCaps(dev)}, nil
}

// do runs fn on a locked OS thread with the target's primary context current.
func (t target) do(fn func() error) error { return cudadrv.With(t.drv, t.ctx, fn) }

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
