package transfer

import (
	"time"

	"github.com/pinmem/pinmem/internal/cpuclock"
)

const haveThreadCPU = cpuclock.HaveThread

func threadCPU() time.Duration  { return cpuclock.Thread() }
func processCPU() time.Duration { return cpuclock.Process() }
