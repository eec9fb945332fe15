package cuda

import "github.com/pinmem/pinmem/internal/cudadrv"

// Fake reports whether the process's driver is now cudatest's fake, which
// runs copies on the CPU and has no timing model: a rate measured on it
// says nothing about a GPU (transfer.Stats says "no timing on the fake"
// instead). It never loads a driver.
func Fake() bool { return cudadrv.IsFake() }
