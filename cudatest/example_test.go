package cudatest_test

import (
	"errors"
	"fmt"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
)

// A fake with two devices, an injected out-of-memory failure, and the leak
// check of Close. In a test, Install(t) does the same and checks at cleanup.
func Example() {
	d, err := cudatest.Start(cudatest.WithDevices(2))
	if err != nil {
		fmt.Println(err)
		return
	}
	n, err := cuda.DeviceCount()
	fmt.Println("devices:", n, err)

	dev, err := cuda.GetDevice(0)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := d.FailOn("cuMemAlloc_v2", cudatest.Once(), cuda.ResultOutOfMemory); err != nil {
		fmt.Println(err)
		return
	}
	_, err = ctx.Alloc(1 << 20)
	fmt.Println("injected:", errors.Is(err, cuda.ErrOutOfMemory))

	buf, err := ctx.Alloc(1 << 20)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("leaks:", errors.Is(d.Leaks(), cudatest.ErrLeak))
	if err := buf.Free(); err != nil {
		fmt.Println(err)
	}
	fmt.Println("close:", d.Close())
	// Output:
	// devices: 2 <nil>
	// injected: true
	// leaks: true
	// close: <nil>
}
