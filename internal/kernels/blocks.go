package kernels

import (
	_ "embed"
)

// blockPTX is the block gather/scatter kernel, written by hand: unlike
// pinmem.ptx it is not nvcc output and has no CUDA C source (there is no
// nvcc on the machines pinmem is developed on). It targets sm_70 with PTX
// ISA 7.0, which every CUDA 11+ driver JIT-compiles.
//
//go:embed blocks.ptx
var blockPTX []byte

// KernelBlockCopy is the entry point of BlockCopyImage:
//
//	pinmem_block_copy(descs ptr, count u32)
//
// For each b < count (one CTA per block, grid-stride) it copies the n
// bytes of descriptor b from src to dst, 16-byte vectors when dst, src and
// n are multiples of 16 and single bytes otherwise. A descriptor is three
// little-endian u64, dst, src, n (BlockDescSize bytes); addresses are
// generic (device memory or mapped host memory).
const KernelBlockCopy = "pinmem_block_copy"

// BlockDescSize is the size of one descriptor of KernelBlockCopy.
const BlockDescSize = 24

// BlockCopyImage returns the NUL-terminated PTX of KernelBlockCopy, as
// cuModuleLoadData takes it.
func BlockCopyImage() []byte {
	img := make([]byte, len(blockPTX)+1)
	copy(img, blockPTX)
	return img
}

// BlockCopyTwin does what KernelBlockCopy does, on host memory: mem
// returns the bytes at an address. It is the kernel's definition for the
// fake driver and tests.
func BlockCopyTwin(descs []byte, count int, mem func(addr, n uint64) ([]byte, error)) error {
	le := func(b []byte) uint64 {
		var v uint64
		for i := range 8 {
			v |= uint64(b[i]) << (8 * i)
		}
		return v
	}
	for b := range count {
		d := descs[b*BlockDescSize : (b+1)*BlockDescSize]
		dst, src, n := le(d), le(d[8:]), le(d[16:])
		s, err := mem(src, n)
		if err != nil {
			return err
		}
		t, err := mem(dst, n)
		if err != nil {
			return err
		}
		copy(t, s)
	}
	return nil
}
