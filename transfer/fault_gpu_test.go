package transfer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/internal/track"
)

// envFaultChild marks the child process in which TestGPUZZKernelFault
// really faults a kernel.
const envFaultChild = "PINMEM_TRANSFER_FAULT_CHILD"

// faultMarker starts the line the child prints with the error it saw.
const faultMarker = "KERNEL-FAULT-RESULT:"

// TestGPUZZKernelFault runs a kernel that faults (it writes through an
// invalid pointer) in a Pipeline; the Pipeline must return the driver's
// typed error (a *cuda.Error with CUDA_ERROR_ILLEGAL_ADDRESS, matching
// cuda.ErrLaunchFailed), never success.
//
// An illegal address is a sticky error: the faulted context, and on
// current GPUs the whole process's CUDA state, is unusable afterwards, so
// nothing created in it can be freed and the leak check of TestMain would
// fail, or later tests would. The fault therefore happens in a child
// process: this test re-executes the test binary with only itself and
// PINMEM_TRANSFER_FAULT_CHILD=1, and checks the child's verdict. The
// child inherits PINMEM_REQUIRE_GPU, so it too fails rather than skips
// without a GPU; a skip in the child is a failure here.
func TestGPUZZKernelFault(t *testing.T) {
	testutil.RequireGPU(t)
	if os.Getenv(envFaultChild) == "1" {
		kernelFaultChild(t)
		return
	}
	timeout := 2 * time.Minute
	if d, ok := t.Deadline(); ok {
		timeout = min(timeout, time.Until(d)-5*time.Second)
	}
	if timeout < 10*time.Second {
		t.Fatalf("only %v left before the test binary's -test.timeout: too little to run the child that faults the kernel (give the binary more time)", max(timeout, 0))
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestGPUZZKernelFault$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envFaultChild+"=1")
	outb, err := cmd.CombinedOutput()
	out := string(outb)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("running the child test binary: %v", err)
	}
	if err != nil || !strings.Contains(out, "--- PASS: TestGPUZZKernelFault") {
		t.Fatalf("the child that faults the kernel did not pass (%v):\n%s", err, out)
	}
	m := regexp.MustCompile(faultMarker + ` code=(\d+) name=(\S+) launchfailed=(\w+) err=(.*)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the child printed no %s line:\n%s", faultMarker, out)
	}
	if m[1] != fmt.Sprint(int(cudadrv.ErrorIllegalAddress)) || m[2] != "CUDA_ERROR_ILLEGAL_ADDRESS" || m[3] != "true" {
		t.Fatalf("the fault propagated as code %s (%s), matching ErrLaunchFailed: %s; want %d (CUDA_ERROR_ILLEGAL_ADDRESS) matching it:\n%s",
			m[1], m[2], m[3], int(cudadrv.ErrorIllegalAddress), out)
	}
	t.Logf("fault reported in the child as: %s", m[4])
}

// kernelFaultChild is the body of TestGPUZZKernelFault in the child process.
func kernelFaultChild(t *testing.T) {
	// The process is poisoned once the kernel faults: whatever was created
	// in it can no longer be released. Forget it here, listing it, so that
	// the child's own leak check judges only what came before the fault.
	type key struct {
		k  track.Kind
		id uint64
	}
	before := map[key]bool{}
	for _, o := range track.Live() {
		before[key{o.Kind, o.ID}] = true
	}
	t.Cleanup(func() {
		for _, o := range track.Live() {
			if !before[key{o.Kind, o.ID}] {
				t.Logf("abandoned in the faulted process: %v %#x (%d bytes)", o.Kind, o.ID, o.Size)
				track.Remove(o.Kind, o.ID)
			}
		}
	})
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := cuda.NewContext(dev, cuda.SchedAuto)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Destroy()
	c, err := New(ctx, WithStageSize(4<<20), WithDepth(2))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	f := gpuKernel(t, ctx, kernels.KernelAdd)
	p, err := newTestPipeline(c, pipelineCfg{ChunkSize: 1 << 20, Streams: 2,
		Work: func(s *cuda.Stream, ch Chunk) error {
			ptr := ch.Dev.Ptr()
			if ch.Index == 2 {
				ptr = 0x10 // not device memory
			}
			return f.Launch(s, cuda.D1(4), cuda.D1(256), 0, ptr, uint64(ch.Len), uint8(1))
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	in := testutil.RandomBytes(8<<20, 16)
	st, err := p.Run(context.Background(), in, make([]byte, len(in)))
	var ce *cuda.Error
	if !errors.As(err, &ce) {
		t.Fatalf("Run with a faulting kernel: %+v, %v (no *cuda.Error)", st, err)
	}
	fmt.Printf("%s code=%d name=%s launchfailed=%t err=%v\n", faultMarker, int(ce.Code), ce.Name, errors.Is(err, cuda.ErrLaunchFailed), err)
	if !errors.Is(err, cuda.ErrLaunchFailed) {
		t.Fatalf("Run with a faulting kernel: %+v, %v", st, err)
	}
	if st.Chunks >= 8 {
		t.Fatalf("a faulted run delivered every chunk: %+v", st)
	}
}
