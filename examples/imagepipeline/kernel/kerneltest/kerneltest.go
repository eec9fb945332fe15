// Package kerneltest gives the imagepipeline kernel a Go body (kernel.Blur)
// on cudatest's fake driver, for the tests of the example and of its
// measurement program.
package kerneltest

import (
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/imagepipeline/kernel"
)

// Install installs the fake driver with the kernel as a Go function; wrong,
// when true, makes it change the last byte of every frame.
func Install(t testing.TB, wrong bool) *cudatest.Driver {
	d := cudatest.Install(t)
	err := d.RegisterKernel(kernel.Name, 4, func(k *cudatest.Kernel) error {
		w, h := int(uint32(k.Arg(2))), int(uint32(k.Arg(3)))
		in, err := k.Mem(cuda.DevicePtr(k.Arg(0)), w*h*4)
		if err != nil {
			return err
		}
		out, err := k.Mem(cuda.DevicePtr(k.Arg(1)), w*h*4)
		if err != nil {
			return err
		}
		kernel.Blur(out, in, w, h)
		if wrong {
			out[len(out)-1]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}
