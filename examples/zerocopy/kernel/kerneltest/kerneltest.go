// Package kerneltest gives the zerocopy kernel a Go body on cudatest's fake
// driver, for the tests of the example and of its measurement program.
package kerneltest

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/zerocopy/kernel"
)

// Install installs the fake driver with the kernel as a Go function; wrong,
// when true, makes it leave the last element unwritten.
func Install(t testing.TB, wrong bool) *cudatest.Driver {
	d := cudatest.Install(t)
	err := d.RegisterKernel(kernel.Name, 4, func(k *cudatest.Kernel) error {
		n := int(k.Arg(2))
		in, err := k.Mem(cuda.DevicePtr(k.Arg(0)), 4*n)
		if err != nil {
			return err
		}
		out, err := k.Mem(cuda.DevicePtr(k.Arg(1)), 4*n)
		if err != nil {
			return err
		}
		if wrong {
			n--
		}
		for i := range n {
			x := math.Float32frombits(binary.LittleEndian.Uint32(in[4*i:]))
			c := i % kernel.Channels
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits((x-kernel.Mean[c])/kernel.Std[c]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}
