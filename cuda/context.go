package cuda

import (
	"fmt"
	"sync/atomic"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/track"
)

type ctxKind int

const (
	ctxPrimary  ctxKind = iota // a device's primary context, retained for the process
	ctxOwned                   // created by NewContext, destroyed by Destroy
	ctxBorrowed                // created by other code; never destroyed by pinmem
)

// Context is a CUDA context. Most code uses a device's primary context
// (Device.PrimaryContext); NewContext creates a separate one, and
// WrapContext borrows one created elsewhere.
type Context struct {
	drv       cudadrv.Driver
	h         cudadrv.Context
	dev       *Device
	kind      ctxKind
	destroyed atomic.Bool
}

// ContextFlags are cuCtxCreate's scheduling and mapping flags.
type ContextFlags uint32

// Context flags.
const (
	SchedAuto         ContextFlags = ContextFlags(cudadrv.CtxSchedAuto)
	SchedSpin         ContextFlags = ContextFlags(cudadrv.CtxSchedSpin)
	SchedYield        ContextFlags = ContextFlags(cudadrv.CtxSchedYield)
	SchedBlockingSync ContextFlags = ContextFlags(cudadrv.CtxSchedBlockingSync)
	MapHost           ContextFlags = ContextFlags(cudadrv.CtxMapHost)
)

// NewContext creates a new context on dev, owned by the caller, who must
// Destroy it. Most programs want the primary context instead; a second
// context is how tests show that portable pinned memory works from every
// context.
func NewContext(dev *Device, flags ContextFlags) (*Context, error) {
	h, err := dev.drv.CtxCreate(uint32(flags), dev.dev)
	if err != nil {
		return nil, err
	}
	// cuCtxCreate makes the new context current on this thread; it is not
	// bound to any goroutine, so nothing else needs undoing.
	track.Add(track.Context, uint64(h), 0)
	return &Context{drv: dev.drv, h: h, dev: dev, kind: ctxOwned}, nil
}

// WrapContext borrows a CUcontext created by other code (TensorRT, ONNX
// Runtime, cgo) for use with pinmem. pinmem never destroys it.
func WrapContext(dev *Device, handle uintptr) *Context {
	return &Context{drv: dev.drv, h: cudadrv.Context(handle), dev: dev, kind: ctxBorrowed}
}

// Handle returns the raw CUcontext.
func (c *Context) Handle() uintptr { return uintptr(c.h) }

// Device returns the context's device.
func (c *Context) Device() *Device { return c.dev }

// Borrowed reports whether the context belongs to other code.
func (c *Context) Borrowed() bool { return c.kind == ctxBorrowed }

func (c *Context) alive() error {
	if c.destroyed.Load() {
		return fmt.Errorf("cuda: context %#x already destroyed: %w", uintptr(c.h), ErrInvalidHandle)
	}
	return nil
}

// enter locks the OS thread and makes c current; always pair with cudadrv.Exit.
func (c *Context) enter() error {
	if err := c.alive(); err != nil {
		cudadrv.Exit()
		return err
	}
	return cudadrv.Enter(c.drv, c.h)
}

// Do runs fn on a goroutine locked to its OS thread with c current, for
// code that calls the driver (or a library that does) directly.
func (c *Context) Do(fn func() error) error {
	defer cudadrv.Exit()
	if err := c.enter(); err != nil {
		return err
	}
	return fn()
}

// Synchronize waits until all work in the context has finished.
func (c *Context) Synchronize() error {
	defer cudadrv.Exit()
	if err := c.enter(); err != nil {
		return err
	}
	return c.drv.CtxSynchronize()
}

// MemInfo returns the device memory free and in total, in bytes.
func (c *Context) MemInfo() (free, total uint64, err error) {
	defer cudadrv.Exit()
	if err := c.enter(); err != nil {
		return 0, 0, err
	}
	return c.drv.MemGetInfo()
}

// Destroy destroys a context made by NewContext. Destroying a primary or
// borrowed context is refused with ErrInvalidValue; a second Destroy
// returns an error matching ErrInvalidHandle.
func (c *Context) Destroy() error {
	if c.kind != ctxOwned {
		return fmt.Errorf("cuda: context %#x is not owned by pinmem (primary or borrowed): %w", uintptr(c.h), ErrInvalidValue)
	}
	if !c.destroyed.CompareAndSwap(false, true) {
		return c.alive()
	}
	track.Remove(track.Context, uint64(c.h))
	return c.drv.CtxDestroy(c.h)
}

// CurrentContextHandle returns the raw CUcontext current on the calling OS
// thread (0 if none), for interop with code that manages contexts itself.
// The answer is only meaningful if the caller has locked its goroutine to
// the thread (runtime.LockOSThread).
func CurrentContextHandle() (uintptr, error) {
	d, err := driver()
	if err != nil {
		return 0, err
	}
	c, err := d.CtxGetCurrent()
	return uintptr(c), err
}
