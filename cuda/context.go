package cuda

import (
	"context"
	"fmt"
	"runtime"
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
	SchedAuto         ContextFlags = 0x0
	SchedSpin         ContextFlags = 0x1
	SchedYield        ContextFlags = 0x2
	SchedBlockingSync ContextFlags = 0x4
	MapHost           ContextFlags = 0x8
)

// NewContext creates a new context on dev, owned by the caller, who must
// Destroy it. Most programs want the primary context instead; a second
// context is how tests show that portable pinned memory works from every
// context.
func NewContext(dev *Device, flags ContextFlags) (*Context, error) {
	if dev == nil {
		return nil, errNilDevice
	}
	// cuCtxCreate makes the new context current on the calling thread: the
	// thread stays locked for the call, and its previous context is put
	// back, as Context methods do when they return.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prev, err := pub2(dev.drv.CtxGetCurrent())
	if err != nil {
		return nil, err
	}
	h, err := pub2(dev.drv.CtxCreate(uint32(flags), dev.dev))
	if err != nil {
		return nil, err
	}
	_ = dev.drv.CtxSetCurrent(prev)
	track.Add(track.Context, uint64(h), 0)
	return &Context{drv: dev.drv, h: h, dev: dev, kind: ctxOwned}, nil
}

// WrapContext borrows a CUcontext created by other code (TensorRT, ONNX
// Runtime, cgo) for use with pinmem. pinmem never destroys it.
// A nil dev or a zero handle gives a Context whose methods return an error
// matching ErrInvalidValue.
func WrapContext(dev *Device, handle uintptr) *Context {
	if dev == nil || handle == 0 {
		return &Context{dev: dev, h: cudadrv.Context(handle), kind: ctxBorrowed}
	}
	return &Context{drv: dev.drv, h: cudadrv.Context(handle), dev: dev, kind: ctxBorrowed}
}

// Handle returns the raw CUcontext (0 for a nil Context).
func (c *Context) Handle() uintptr {
	if c == nil {
		return 0
	}
	return uintptr(c.h)
}

// Device returns the context's device.
func (c *Context) Device() *Device {
	if c == nil {
		return nil
	}
	return c.dev
}

// alive returns nil for a usable context, an error matching ErrInvalidValue
// for a nil one and ErrInvalidHandle for a destroyed one.
func (c *Context) alive() error {
	if c == nil || c.drv == nil {
		return fmt.Errorf("cuda: nil context: %w", ErrInvalidValue)
	}
	if c.destroyed.Load() {
		return fmt.Errorf("cuda: context %#x already destroyed: %w", uintptr(c.h), ErrInvalidHandle)
	}
	return nil
}

// enter locks the OS thread and makes c current (cudadrv.Enter). The
// caller defers Exit on the Scope in every case: when c is not usable the
// Scope is the zero one, which took no lock, so its Exit releases nothing
// of the caller's own.
func (c *Context) enter() (cudadrv.Scope, error) {
	if err := c.alive(); err != nil {
		return cudadrv.Scope{}, err
	}
	sc, err := cudadrv.Enter(c.drv, c.h)
	return sc, pub(err)
}

// Do runs fn on a goroutine locked to its OS thread with c current, for
// code that calls the driver (or a library that does) directly. The
// context that was current on the thread before is current again when Do
// returns. A nil fn is refused with ErrInvalidValue.
func (c *Context) Do(fn func() error) error {
	if fn == nil {
		return fmt.Errorf("cuda: Context.Do with a nil function: %w", ErrInvalidValue)
	}
	sc, err := c.enter()
	defer sc.Exit()
	if err != nil {
		return err
	}
	return pub(fn())
}

// Synchronize waits until all work in the context has finished, or until
// ctx is done: then it returns ctx.Err() and the work may still be running.
// The driver has no query for a whole context, so with a ctx that can end the
// driver's wait runs on a goroutine of its own, which ends when the work does
// (on a hung device, never); prefer Stream.Synchronize or Event.Synchronize,
// which poll. A nil ctx is refused with ErrInvalidValue.
func (c *Context) Synchronize(ctx context.Context) error {
	if err := checkCtx(ctx, "Context.Synchronize"); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	wait := func() error {
		sc, err := c.enter()
		defer sc.Exit()
		if err != nil {
			return err
		}
		return pub(c.drv.CtxSynchronize())
	}
	if ctx.Done() == nil {
		return wait()
	}
	done := make(chan error, 1) // buffered: the goroutine never blocks on an abandoned wait
	go func() { done <- wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// MemInfo returns the device memory free and in total, in bytes.
func (c *Context) MemInfo() (free, total uint64, err error) {
	sc, err := c.enter()
	defer sc.Exit()
	if err != nil {
		return 0, 0, err
	}
	free, total, err = c.drv.MemGetInfo()
	return free, total, pub(err)
}

// Destroy destroys a context made by NewContext. Destroying a primary or
// borrowed context is refused with ErrInvalidValue; a second Destroy
// returns an error matching ErrInvalidHandle. When the driver fails to release it,
// it stays usable and the call may be repeated.
func (c *Context) Destroy() error {
	if err := c.alive(); c == nil || c.drv == nil {
		return err
	}
	if c.kind != ctxOwned {
		return fmt.Errorf("cuda: context %#x is not owned by pinmem (primary or borrowed): %w", uintptr(c.h), ErrInvalidValue)
	}
	if !c.destroyed.CompareAndSwap(false, true) {
		return c.alive()
	}
	if err := pub(c.drv.CtxDestroy(c.h)); err != nil {
		// The driver still holds the context: it stays usable, and
		// Destroy may be called again.
		c.destroyed.Store(false)
		return err
	}
	track.Remove(track.Context, uint64(c.h))
	return nil
}

// release runs call, the driver call that releases an object of ctx whose
// flag (freed, destroyed, unloaded) the caller has just set, so that
// concurrent users already see it gone. The books follow the driver: when
// call fails the driver still holds the object, so the flag is cleared, the
// object stays tracked and the release may be retried; when ctx itself was
// destroyed the driver released the object with it, so it is untracked and
// the flag stays set.
func release(ctx *Context, flag *atomic.Bool, kind track.Kind, id uint64, call func() error) error {
	sc, err := ctx.enter()
	defer sc.Exit()
	if err == nil {
		err = pub(call())
	}
	switch {
	case err == nil, ctx.destroyed.Load():
		track.Remove(kind, id)
	default:
		flag.Store(false)
	}
	return err
}
