package cudatest

import (
	"strings"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
)

// maxKernelArgs is the most arguments a fake kernel takes, as cuda's Launch.
const maxKernelArgs = 64

// Kernel is one launch of a fake kernel, as its Go body sees it.
type Kernel struct {
	// Name is the kernel's name.
	Name string
	// Grid and Block are the launch's shape.
	Grid, Block cuda.Dim3
	call        *fakedrv.KernelCall
}

// Arg returns argument i as cuda.Function.Launch passed it: the value in the
// low bytes of an 8-byte little-endian slot (a cuda.DevicePtr, an integer,
// the bits of a float, 0 or 1 for a bool), or 0 for an argument the kernel
// does not take.
func (k *Kernel) Arg(i int) uint64 {
	if k == nil || k.call == nil {
		return 0
	}
	return k.call.Uint64(i)
}

// Mem returns the n bytes of device memory (or mapped pinned memory) at p,
// for the body to read and write. It fails with an error matching
// cuda.ErrInvalidValue unless all n bytes are allocated. The slice is
// valid only while the body runs.
func (k *Kernel) Mem(p cuda.DevicePtr, n int) ([]byte, error) {
	if k == nil || k.call == nil {
		return nil, invalid("Mem of a nil Kernel")
	}
	if n < 0 {
		return nil, invalid("Kernel.Mem(%#x, %d): negative size", uint64(p), n)
	}
	b, err := k.call.Mem(cudadrv.DevicePtr(p), uint64(n))
	if err != nil {
		// The fake's reason, without the driver error around it: this is
		// no driver call, and the launch's error names the kernel.
		why := err.Error()
		if _, after, ok := strings.Cut(why, "; cudatest: "); ok {
			why = after
		}
		return nil, invalid("Kernel.Mem(%#x, %d): %s", uint64(p), n, why)
	}
	return b, nil
}

// RegisterKernel makes a kernel named name, taking nargs arguments, found
// by cuda.Module.Function in every module loaded from the fake (which loads
// any PTX text, that is text starting with "//" or ".version", and any ELF
// image). Each launch queues body on the launch's stream; it runs in stream
// order, like device work. body must not call pinmem or the driver, and
// may use Kernel.Mem to reach device memory; an error from it fails the
// launch asynchronously with CUDA_ERROR_LAUNCH_FAILED (cuda.ErrLaunchFailed),
// and so does a panic in it (the error holds the panic's value and stack);
// as on a GPU the failure is sticky, reported by every later call in the
// context until ClearFaults. A nil body does nothing. Registering a name
// again replaces the kernel for every launch from then on, those of
// Functions looked up before included. RegisterKernel fails with an error matching
// cuda.ErrInvalidValue for an empty name or nargs outside [0, 64].
func (d *Driver) RegisterKernel(name string, nargs int, body func(k *Kernel) error) error {
	if err := d.usable("RegisterKernel"); err != nil {
		return err
	}
	if name == "" {
		return invalid("RegisterKernel: empty name")
	}
	if nargs < 0 || nargs > maxKernelArgs {
		return invalid("RegisterKernel(%q, %d): nargs must be in [0, %d]", name, nargs, maxKernelArgs)
	}
	sizes := make([]int, nargs)
	for i := range sizes {
		sizes[i] = 8
	}
	var fn fakedrv.KernelFunc
	if body != nil {
		fn = func(c *fakedrv.KernelCall) error {
			return body(&Kernel{
				Name:  c.Name,
				Grid:  cuda.Dim3{X: c.Grid[0], Y: c.Grid[1], Z: c.Grid[2]},
				Block: cuda.Dim3{X: c.Block[0], Y: c.Block[1], Z: c.Block[2]},
				call:  c,
			})
		}
	}
	d.fake.RegisterKernel(name, sizes, fn)
	return nil
}
