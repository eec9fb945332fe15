package transfer

import (
	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/lifecycle"
)

// The release helpers free *p and clear it unless the driver still holds
// it (counted in left), so that calling them again retries a failed
// release (see lifecycle.Drop).

func freeBuf(p **pinmem.Buffer, left *int) error {
	return lifecycle.Drop(p, left, (*pinmem.Buffer).Free, pinmem.ErrFreed)
}

func destroyEvent(p **cuda.Event, left *int) error {
	return lifecycle.Drop(p, left, (*cuda.Event).Destroy, cuda.ErrInvalidHandle)
}

func destroyStream(p **cuda.Stream, left *int) error {
	return lifecycle.Drop(p, left, (*cuda.Stream).Destroy, cuda.ErrInvalidHandle)
}

func freeDev(p **cuda.DeviceBuffer, left *int) error {
	return lifecycle.Drop(p, left, (*cuda.DeviceBuffer).Free, cuda.ErrInvalidHandle)
}
