// Package kerneltest gives the vectoradd kernel a Go body on cudatest's fake
// driver, for the tests of the example and of its measurement program.
package kerneltest

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/vectoradd/kernel"
)

// Install installs the fake driver with the kernel as a Go function; wrong,
// when true, makes it add one to element 5.
func Install(t testing.TB, wrong bool) *cudatest.Driver {
	d := cudatest.Install(t)
	err := d.RegisterKernel(kernel.Name, 4, func(k *cudatest.Kernel) error {
		n := int(k.Arg(3)) * 4
		var mem [3][]byte
		for i := range mem {
			var err error
			if mem[i], err = k.Mem(cuda.DevicePtr(k.Arg(i)), n); err != nil {
				return err
			}
		}
		for i := 0; i < n; i += 4 {
			s := math.Float32frombits(binary.LittleEndian.Uint32(mem[0][i:])) + math.Float32frombits(binary.LittleEndian.Uint32(mem[1][i:]))
			if wrong && i == 20 {
				s++
			}
			binary.LittleEndian.PutUint32(mem[2][i:], math.Float32bits(s))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}
