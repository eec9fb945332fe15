package cuda

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/track"
)

// Module is a loaded PTX or cubin image.
type Module struct {
	ctx      *Context
	h        cudadrv.Module
	unloaded atomic.Bool
}

// LoadModule loads a PTX (text) or cubin image into c; the driver
// JIT-compiles PTX for the device. An image the driver cannot use (for
// example PTX newer than the driver) gives an error matching
// ErrKernelImage; nothing else in pinmem depends on kernels loading.
func (c *Context) LoadModule(image []byte) (*Module, error) {
	sc, err := c.enter()
	defer sc.Exit()
	if err != nil {
		return nil, err
	}
	h, err := pub2(c.drv.ModuleLoadData(image))
	if err != nil {
		v, _ := c.drv.DriverGetVersion()
		return nil, fmt.Errorf("cuda: loading a %d-byte module with driver CUDA %d.%d: %w", len(image), v/1000, v%1000/10, err)
	}
	track.Add(track.Module, uint64(h), 0)
	return &Module{ctx: c, h: h}, nil
}

// usable returns nil for a loaded module, an error matching ErrInvalidValue
// for a nil one and ErrInvalidHandle for an unloaded one.
func (m *Module) usable() error {
	if m == nil {
		return fmt.Errorf("cuda: nil module: %w", ErrInvalidValue)
	}
	if m.unloaded.Load() {
		return fmt.Errorf("cuda: module %#x already unloaded: %w", uintptr(m.h), ErrInvalidHandle)
	}
	return nil
}

// Function looks up a kernel by its (extern "C") name.
func (m *Module) Function(name string) (*Function, error) {
	if err := m.usable(); err != nil {
		return nil, err
	}
	sc, err := m.ctx.enter()
	defer sc.Exit()
	if err != nil {
		return nil, err
	}
	f, err := pub2(m.ctx.drv.ModuleGetFunction(m.h, name))
	if err != nil {
		return nil, fmt.Errorf("cuda: kernel %q: %w", name, err)
	}
	return &Function{mod: m, h: f, name: name}, nil
}

// Destroy unloads the module (cuModuleUnload), as Stream, Event and
// Context release their driver objects with Destroy. Its functions become
// invalid. A second Destroy returns an error matching ErrInvalidHandle.
// When the driver fails to release it, it stays usable and the call may
// be repeated.
func (m *Module) Destroy() error {
	if m == nil {
		return m.usable()
	}
	if !m.unloaded.CompareAndSwap(false, true) {
		return fmt.Errorf("cuda: module %#x already unloaded: %w", uintptr(m.h), ErrInvalidHandle)
	}
	return release(m.ctx, &m.unloaded, track.Module, uint64(m.h), func() error { return m.ctx.drv.ModuleUnload(m.h) })
}

// Function is a kernel in a loaded module.
type Function struct {
	mod  *Module
	h    cudadrv.Function
	name string
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// D1 returns the one-dimensional shape n x 1 x 1.
func D1(n int) Dim3 { return Dim3{uint32(n), 1, 1} }

// maxKernelArgs bounds a launch's argument count (each argument takes one 8-byte slot).
const maxKernelArgs = 64

// Launch queues the kernel on s. Each argument is passed by value and must
// be one of: DevicePtr, uintptr, int, int8..int64, uint, uint8..uint64,
// float32, float64, bool. Anything else is refused with ErrInvalidValue.
// The parameter block is pinned Go memory holding no unpinned pointers, as
// the driver requires; it is released when the call returns (the driver
// copies the arguments at launch).
func (f *Function) Launch(s *Stream, grid, block Dim3, sharedMem uint32, args ...any) error {
	if f == nil {
		return fmt.Errorf("cuda: launch of a nil function: %w", ErrInvalidValue)
	}
	if err := s.usable(); err != nil {
		return fmt.Errorf("cuda: launching %q: %w", f.name, err)
	}
	if len(args) > maxKernelArgs {
		return fmt.Errorf("cuda: kernel %q: %d arguments, at most %d: %w", f.name, len(args), maxKernelArgs, ErrInvalidValue)
	}
	if grid.X == 0 || grid.Y == 0 || grid.Z == 0 || block.X == 0 || block.Y == 0 || block.Z == 0 {
		return fmt.Errorf("cuda: kernel %q: empty grid %v or block %v: %w", f.name, grid, block, ErrInvalidValue)
	}
	if f.mod.unloaded.Load() {
		return fmt.Errorf("cuda: kernel %q: module already unloaded: %w", f.name, ErrInvalidHandle)
	}
	vals := make([]uint64, len(args))
	for i, a := range args {
		v, err := argBits(a)
		if err != nil {
			return fmt.Errorf("cuda: kernel %q argument %d: %w", f.name, i, err)
		}
		vals[i] = v
	}
	params, release := cudadrv.KernelParams(vals)
	defer release()
	err := s.call(func() error {
		return s.ctx.drv.LaunchKernel(f.h, [3]uint32{grid.X, grid.Y, grid.Z}, [3]uint32{block.X, block.Y, block.Z}, sharedMem, s.h, params)
	})
	if err != nil {
		return fmt.Errorf("cuda: launching %q: %w", f.name, err)
	}
	return nil
}

// argBits encodes a kernel argument little-endian in the low bytes of a slot.
func argBits(a any) (uint64, error) {
	switch v := a.(type) {
	case DevicePtr:
		return uint64(v), nil
	case uintptr:
		return uint64(v), nil
	case int:
		return uint64(v), nil
	case int8:
		return uint64(uint8(v)), nil
	case int16:
		return uint64(uint16(v)), nil
	case int32:
		return uint64(uint32(v)), nil
	case int64:
		return uint64(v), nil
	case uint:
		return uint64(v), nil
	case uint8:
		return uint64(v), nil
	case uint16:
		return uint64(v), nil
	case uint32:
		return uint64(v), nil
	case uint64:
		return v, nil
	case float32:
		return uint64(math.Float32bits(v)), nil
	case float64:
		return math.Float64bits(v), nil
	case bool:
		if v {
			return 1, nil
		}
		return 0, nil
	}
	return 0, fmt.Errorf("unsupported type %T (pass device memory as cuda.DevicePtr): %w", a, ErrInvalidValue)
}
