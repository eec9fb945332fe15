// Package soak holds pinmem's long-running reliability checks on a real
// GPU: a soak of pools, copies and pipelines with every byte checksummed,
// the budget under concurrent pressure, and a process killed in the middle
// of transfers whose pinned memory the host must get back. Its tests skip
// without a GPU (and fail instead under PINMEM_REQUIRE_GPU=1); the soak
// itself runs only when PINMEM_SOAK_SECONDS is set. Each reports its
// figures on lines beginning "SOAK:".
package soak
