package cudatest

import "github.com/pinmem/pinmem/internal/cudadrv"

type result = cudadrv.Result
