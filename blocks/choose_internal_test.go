package blocks

import "testing"

// TestPick is Auto's decision as a table, with the figures behind each
// row (H100, PCIe Gen5 x16, 4096 blocks, pinmem bench blocks at 161fae3,
// and the C reference cref/blocks in the same lease).
func TestPick(t *testing.T) {
	for _, c := range []struct {
		kernel, batch, legacy bool
		mean                  int64
		want                  Strategy
		why                   string
	}{
		{true, true, false, 16 << 10, Kernel, "16 KiB: kernel 26.7 GB/s h2d against the batch's 13.7; 38.4 against 28.9 d2h; 30.7 against 8.8 both ways"},
		{true, true, false, 4 << 10, Kernel, "smaller blocks: the batch's per-block cost weighs more still"},
		{true, false, true, 16 << 10, Kernel, "the kernel needs neither the driver's batch nor a non-legacy stream"},
		{true, true, false, kernelMax - 1, Kernel, "under 256 KiB: on an H200 the kernel was the fastest strategy from 16 to 256 KiB one way"},
		{true, true, false, kernelMax, DriverBatch, "256 KiB: the batch is at 0.9 of the link one way (C batch 49.5 / 49.9 GB/s), and DMA wins both ways"},
		{true, true, false, 2 << 20, PerCopy, "2 MiB: one copy per block, 66.7 GB/s both ways = 0.915 of the bidirectional bound; an SM kernel peaks at 51-52 one way"},
		{false, true, false, 16 << 10, DriverBatch, "no kernel (or a host block not mapped): the batch's one call per 1024 blocks beats a call per block (C loop 5.5 GB/s at 16 KiB)"},
		{false, true, false, batchMax, DriverBatch, "1 MiB: the batch still saves a call per block"},
		{false, true, false, batchMax + 1, PerCopy, "over 1 MiB the per-call cost is under a tenth of a block's bus time, and every driver has one copy per block"},
		{false, true, true, 16 << 10, PerCopy, "the driver's batch refuses the legacy default stream"},
		{false, false, false, 16 << 10, PerCopy, "a driver before CUDA 12.8 has no batch copy"},
	} {
		if got := pick(c.kernel, c.batch, c.legacy, c.mean); got != c.want {
			t.Errorf("pick(kernel %v, batch %v, legacy %v, mean %d) = %v, want %v: %s", c.kernel, c.batch, c.legacy, c.mean, got, c.want, c.why)
		}
	}
}

// TestKernelGrid is the kernel's launch width as a table, with the figures
// behind it (H100, 132 SMs; internal/kernels/testdata/blockshape.cu).
func TestKernelGrid(t *testing.T) {
	for _, c := range []struct {
		n, sms, want int
		why          string
	}{
		{4096, 132, 132, "4096 blocks of 16 KiB both ways: one CTA per SM 52 GB/s, one per block 41; one way the same either way"},
		{512, 132, 132, "512 blocks of 2 MiB both ways: 48 against 44 GB/s"},
		{100, 132, 100, "fewer blocks than SMs: one CTA each, none idle"},
		{1, 132, 1, "one block"},
		{5, 0, 1, "a device that reports no SMs still gets a launch"},
	} {
		if got := kernelGrid(c.n, c.sms); got != c.want {
			t.Errorf("kernelGrid(%d, %d) = %d, want %d: %s", c.n, c.sms, got, c.want, c.why)
		}
	}
}
