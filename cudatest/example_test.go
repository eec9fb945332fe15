package cudatest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/transfer"
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

// primaryContext returns device 0's primary context of the installed driver.
func primaryContext() (*cuda.Context, error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return nil, err
	}
	return dev.PrimaryContext()
}

// A fault on any host-to-device copy hits a Copier's upload whatever its
// size, whichever driver function the size's path calls.
func ExampleDriver_FailOn_class() {
	d, err := cudatest.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	ctx, err := primaryContext()
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := transfer.New(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close(context.Background())
	dst, err := ctx.Alloc(4 << 20)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dst.Free()
	if err := d.FailAsync(cudatest.AnyHtoD, cudatest.Always(), cuda.ResultLaunchFailed); err != nil {
		fmt.Println(err)
		return
	}
	for _, n := range []int{1, 64 << 10, 4 << 20} {
		part, _ := dst.Slice(0, n)
		_, err := c.HtoD(context.Background(), part, make([]byte, n))
		fmt.Printf("%d bytes: %v\n", n, errors.Is(err, cuda.ErrLaunchFailed))
	}
	// Output:
	// 1 bytes: true
	// 65536 bytes: true
	// 4194304 bytes: true
}

// A sticky fault breaks the context, as CUDA_ERROR_ILLEGAL_ADDRESS does on
// a GPU: the fault is reported by the next synchronization, and every
// later call in the context fails too, until ClearFaults.
func ExampleWhen_Sticky() {
	d, err := cudatest.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	ctx, err := primaryContext()
	if err != nil {
		fmt.Println(err)
		return
	}
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Destroy()
	buf, err := ctx.Alloc(256)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer buf.Free()
	if err := d.FailAsync("cuMemsetD8Async", cudatest.Once().Sticky(), cuda.ResultIllegalAddress); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("memset queued:", s.Memset(buf, 0, 0, 256))
	var ce *cuda.Error
	errors.As(s.Synchronize(context.Background()), &ce)
	fmt.Println("synchronize:", ce.Name)
	_, err = ctx.Alloc(256)
	errors.As(err, &ce)
	fmt.Println("a later allocation:", ce.Name)
	d.ClearFaults()
	fmt.Println("after ClearFaults:", s.Synchronize(context.Background()))
	// Output:
	// memset queued: <nil>
	// synchronize: CUDA_ERROR_ILLEGAL_ADDRESS
	// a later allocation: CUDA_ERROR_ILLEGAL_ADDRESS
	// after ClearFaults: <nil>
}

// A test holds a stream, waits until the code under test is blocked on
// it (no sleep standing in for that), and releases it.
func ExampleDriver_WaitBlocked() {
	d, err := cudatest.Start(cudatest.WithWaitTimeout(0)) // wait as long as a GPU would
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	ctx, err := primaryContext()
	if err != nil {
		fmt.Println(err)
		return
	}
	s, err := ctx.NewStream(0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Destroy()
	buf, err := ctx.Alloc(256)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer buf.Free()
	if err := d.HoldStream(s); err != nil {
		fmt.Println(err)
		return
	}
	if err := s.Memset(buf, 0, 1, 256); err != nil { // held: it waits
		fmt.Println(err)
		return
	}
	synced := make(chan error)
	go func() { synced <- s.Synchronize(context.Background()) }() // the code under test
	op, err := d.WaitBlocked(context.Background(), s)
	fmt.Println("blocked:", op, err)
	if err := d.ReleaseStream(s); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("synchronize:", <-synced)
	// Output:
	// blocked: cuStreamSynchronize <nil>
	// synchronize: <nil>
}
