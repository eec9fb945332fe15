package pinmem

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/pinmem/pinmem/cuda"
)

// Pinned memory shared between processes on one host.
//
// AllocShared pins memory backed by a file (a memfd) instead of private
// anonymous memory. SendShared sends that file over a Unix socket
// (SCM_RIGHTS) with the buffer's size and flags; ReceiveShared, in the
// other process, maps the same pages and registers them with its own CUDA
// context: the result is an ordinary Buffer of that process, pinned, copied
// at pinned speed, counted by its ledger and budget, freed with Free. The
// pages stay while either side maps them, so either process may exit
// first. (cuMemCreate on a host NUMA node with a POSIX file descriptor
// handle, the driver's own way to share host memory, is not used: the
// memfd path needs nothing but cuMemHostRegister on both sides.)

// ErrShareMismatch: what ReceiveShared received is not what it expected
// (size or flags), or not a buffer SendShared sent. The error says which
// field differed, with both values.
var ErrShareMismatch = errors.New("pinmem: shared buffer does not match")

// mismatch is ReceiveShared's error for field.
func mismatch(field, want, got string) error {
	return fmt.Errorf("pinmem: ReceiveShared: %s: want %s, got %s: %w", field, want, got, ErrShareMismatch)
}

// sharedFile is a shared buffer's file: kept open so that the buffer can
// be sent again, closed when the buffer is released.
type sharedFile struct {
	once sync.Once
	fd   int
}

func (f *sharedFile) close() {
	if f != nil {
		f.once.Do(func() { closeFD(f.fd) })
	}
}

// shareMsg is the metadata sent with the file: magic, version, the
// buffer's size (as requested), its flags and the mapping's length.
const (
	shareMagic   = 0x48534d50 // "PMSH" little-endian
	shareVersion = 1
	shareMsgLen  = 4 + 4 + 8 + 4 + 4 + 8
)

// bindCtx bounds the socket's reads (write false) or writes (write true)
// by ctx: the deadline, and a cancel that sets one in the past. Only that
// direction's deadline is set, so that a send and a receive on one
// connection at once (two processes swapping buffers) do not end each
// other. The returned function undoes it.
func bindCtx(ctx context.Context, conn *net.UnixConn, write bool) (undo func(), err error) {
	if ctx == nil || conn == nil {
		return nil, fmt.Errorf("pinmem: nil context or connection: %w", cuda.ErrInvalidValue)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	set := conn.SetReadDeadline
	if write {
		set = conn.SetWriteDeadline
	}
	d, _ := ctx.Deadline()
	if err := set(d); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = set(time.Unix(1, 0)) })
	return func() { stop(); _ = set(time.Time{}) }, nil
}

// ctxErr adds ctx's error to err, a socket error, when ctx has ended. A
// socket that timed out at ctx's deadline may do so a moment before ctx
// itself ends: then ctx is waited for. A timeout before ctx's deadline
// came from another call's context on the same connection: err alone.
func ctxErr(ctx context.Context, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			<-ctx.Done()
		}
	}
	if ctx.Err() != nil {
		return errors.Join(err, ctx.Err())
	}
	return err
}
