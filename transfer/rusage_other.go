//go:build !linux

package transfer

import "time"

const haveThreadCPU = false

func threadCPU() time.Duration { return 0 }

func processCPU() time.Duration { return 0 }
