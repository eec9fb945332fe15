//go:build !linux

package pinmem

import (
	"context"
	"fmt"
	"net"
	"runtime"

	"github.com/pinmem/pinmem/cuda"
)

func closeFD(int) {}

// AllocShared is implemented only on Linux (memfd).
func AllocShared(size int, flags Flags, opts ...Option) (*Buffer, error) {
	return nil, fmt.Errorf("pinmem: AllocShared on %s: %w", runtime.GOOS, cuda.ErrNotSupported)
}

// SendShared is implemented only on Linux.
func SendShared(ctx context.Context, conn *net.UnixConn, b *Buffer) error {
	return fmt.Errorf("pinmem: SendShared on %s: %w", runtime.GOOS, cuda.ErrNotSupported)
}

// ReceiveShared is implemented only on Linux.
func ReceiveShared(ctx context.Context, conn *net.UnixConn, size int, flags Flags, opts ...Option) (*Buffer, error) {
	return nil, fmt.Errorf("pinmem: ReceiveShared on %s: %w", runtime.GOOS, cuda.ErrNotSupported)
}
