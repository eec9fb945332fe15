//go:build linux

package pinmem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// The two-process test starts the test binary again as the exporter: with
// envShareChild set to a size, init runs shareChild instead of the tests.
const envShareChild = "PINMEM_SHARE_TEST_CHILD"

func init() {
	if v := os.Getenv(envShareChild); v != "" {
		n, _ := strconv.Atoi(v)
		if err := shareChild(n); err != nil {
			fmt.Fprintln(os.Stderr, "share child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// shareChild exports a shared buffer of n bytes filled from seed 1 over the
// socket at descriptor 3, waits for a byte, checks that the buffer now
// holds seed 2's bytes (written by the other process) and answers "ok".
func shareChild(n int) error {
	restore, err := fakedrv.Install(fakedrv.New(fakedrv.Options{}), "share child")
	if err != nil {
		return err
	}
	defer restore()
	fc, err := net.FileConn(os.NewFile(3, "socket"))
	if err != nil {
		return err
	}
	conn := fc.(*net.UnixConn)
	b, err := AllocShared(n, 0)
	if err != nil {
		return err
	}
	copy(b.Bytes(), testutil.RandomBytes(n, 1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := SendShared(ctx, conn, b); err != nil {
		return err
	}
	one := make([]byte, 1)
	if _, err := conn.Read(one); err != nil {
		return err
	}
	answer := "ok"
	if !bytes.Equal(b.Bytes(), testutil.RandomBytes(n, 2)) {
		answer = "no"
	}
	if _, err := conn.Write([]byte(answer)); err != nil {
		return err
	}
	return b.Free()
}

func socketPair(t *testing.T) (a, b *net.UnixConn) { return socketPairTB(t) }

func socketPairTB(t testing.TB) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestShareTwoProcesses: a buffer exported by another process is imported
// as this process's buffer (counted by its ledger), holds the exporter's
// bytes, and what this process writes is what the exporter reads: the
// memory is shared for real. It stays usable after the exporter exited.
func TestShareTwoProcesses(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	const n = 3<<20 + 100
	mine, theirs := socketPair(t)
	f, err := theirs.File()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envShareChild+"="+strconv.Itoa(n))
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	theirs.Close()
	before := Stats()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := ReceiveShared(ctx, mine, n, 0)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal(err)
	}
	if got := Stats().Pinned.Bytes - before.Pinned.Bytes; got != int64(roundUp(n, pageSize)) {
		t.Errorf("the ledger counts %d more bytes, want %d", got, roundUp(n, pageSize))
	}
	if b.Len() != n || b.Kind() != KindMmapRegister {
		t.Errorf("imported buffer %v", b)
	}
	testutil.CheckBytes(t, testutil.RandomBytes(n, 1), b.Bytes())
	copy(b.Bytes(), testutil.RandomBytes(n, 2))
	if _, err := mine.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	answer := make([]byte, 2)
	if _, err := mine.Read(answer); err != nil || string(answer) != "ok" {
		t.Fatalf("the exporter read back %q (%v), want ok", answer, err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the exporter: %v", err)
	}
	// The exporter is gone; its pages are still this buffer's.
	testutil.CheckBytes(t, testutil.RandomBytes(n, 2), b.Bytes())
	b.Bytes()[n-1] ^= 0xff
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if s := Stats(); s.Pinned.Bytes != before.Pinned.Bytes {
		t.Errorf("after Free the ledger counts %d bytes, before %d", s.Pinned.Bytes, before.Pinned.Bytes)
	}
}

// TestShareMismatch: a size or flags other than expected, a message that
// is not SendShared's, and an import over the budget are typed errors,
// and leave nothing mapped, open or counted.
func TestShareMismatch(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	const n = 1 << 20
	src, err := AllocShared(n, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Free()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fdsBefore := openFDs(t)
	mapsBefore := liveMappings.Load()
	statsBefore := Stats()
	receive := func(size int, flags Flags) error {
		a, b := socketPair(t)
		if err := SendShared(ctx, a, src); err != nil {
			t.Fatal(err)
		}
		buf, err := ReceiveShared(ctx, b, size, flags)
		if err == nil {
			buf.Free()
		}
		return err
	}
	if err := receive(n+1, 0); !errors.Is(err, ErrShareMismatch) || !strings.Contains(err.Error(), "size") {
		t.Errorf("size mismatch: %v", err)
	}
	if err := receive(n, Mapped); !errors.Is(err, ErrShareMismatch) || !strings.Contains(err.Error(), "flags") {
		t.Errorf("flags mismatch: %v", err)
	}
	prev := SetBudget(statsBefore.Pinned.Bytes + n/2)
	err = receive(0, 0)
	SetBudget(prev)
	if !errors.Is(err, ErrBudget) {
		t.Errorf("an import over the budget: %v, want ErrBudget", err)
	}
	a, b := socketPair(t)
	if _, err := a.Write([]byte("not a buffer")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReceiveShared(ctx, b, 0, 0); !errors.Is(err, ErrShareMismatch) || !strings.Contains(err.Error(), "message") {
		t.Errorf("a stray message: %v", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, err := ReceiveShared(short, b, 0, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("nothing sent: %v, want the deadline", err)
	}
	if got := liveMappings.Load(); got != mapsBefore {
		t.Errorf("%d mappings left, %d before", got, mapsBefore)
	}
	if got := openFDs(t); got > fdsBefore+8 { // the socket pairs of this test are closed at cleanup
		t.Errorf("%d descriptors open, %d before", got, fdsBefore)
	}
	if s := Stats(); s.Pinned.Bytes != statsBefore.Pinned.Bytes {
		t.Errorf("the ledger counts %d bytes, %d before", s.Pinned.Bytes, statsBefore.Pinned.Bytes)
	}
	// A good import after all of that, in this process: two mappings of
	// the same pages.
	buf, err := func() (*Buffer, error) {
		a, b := socketPair(t)
		if err := SendShared(ctx, a, src); err != nil {
			return nil, err
		}
		return ReceiveShared(ctx, b, n, 0)
	}()
	if err != nil {
		t.Fatal(err)
	}
	src.Bytes()[12345] = 42
	if buf.Bytes()[12345] != 42 {
		t.Error("the import does not share the exporter's pages")
	}
	if err := buf.Free(); err != nil {
		t.Fatal(err)
	}
	if err := SendShared(ctx, a, mustAlloc(t, 4096)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("SendShared of a buffer that is not shared: %v", err)
	}
}

func mustAlloc(t *testing.T, n int) *Buffer {
	b, err := Alloc(n, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

func openFDs(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	return len(es)
}

// TestShareTwoWayExchange: two processes that swap buffers over one
// connection send and receive on it at once. A SendShared cut short by its
// context (the peer does not read) leaves a ReceiveShared waiting on the
// same connection alone: the receive still gets the peer's buffer, bounded
// by its own context only.
func TestShareTwoWayExchange(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b := socketPair(t)
	// Fill a's way to b, which b does not read, so that a's SendShared blocks.
	if err := a.SetWriteDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 64<<10)
	for {
		if _, err := a.Write(junk); err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal(err)
			}
			break
		}
	}
	if err := a.SetWriteDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	type result struct {
		buf *Buffer
		err error
	}
	got := make(chan result, 1)
	go func() {
		buf, err := ReceiveShared(rctx, a, 4096, 0)
		got <- result{buf, err}
	}()
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	if err := SendShared(short, a, sharedBuf(t, 4096)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SendShared to a peer that does not read: %v, want the deadline", err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := SendShared(ctx, b, sharedBuf(t, 4096)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("ReceiveShared beside a SendShared cut short: %v", r.err)
		}
		if err := r.buf.Free(); err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		rcancel()
		r := <-got
		t.Fatalf("ReceiveShared did not receive the buffer sent 2 s ago (returned %v after its context was cancelled)", r.err)
	}
}

func sharedBuf(t *testing.T, n int) *Buffer {
	b, err := AllocShared(n, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

// TestShareUnsealedFile: a file that its sender could still shrink (a
// memfd without F_SEAL_SHRINK, as any process can send) is refused with
// ErrShareMismatch: mapped and pinned, it would fault this process (SIGBUS)
// on the first access past the new end once the sender truncated it. A
// buffer of AllocShared is sealed, and received.
func TestShareUnsealedFile(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fd, err := unix.MemfdCreate("not pinmem", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4096); err != nil {
		t.Fatal(err)
	}
	msg := shareMsg(4096, 0, 4096)
	a, b := socketPair(t)
	if _, _, err := a.WriteMsgUnix(msg, unix.UnixRights(fd), nil); err != nil {
		t.Fatal(err)
	}
	fdsBefore := openFDs(t)
	buf, err := ReceiveShared(ctx, b, 4096, 0)
	if err == nil {
		buf.Free()
	}
	if !errors.Is(err, ErrShareMismatch) {
		t.Fatalf("a file its sender can shrink: %v, want ErrShareMismatch", err)
	}
	if got := openFDs(t); got != fdsBefore {
		t.Errorf("%d descriptors open, %d before", got, fdsBefore)
	}
	src := sharedBuf(t, 4096)
	if err := SendShared(ctx, a, src); err != nil {
		t.Fatal(err)
	}
	buf, err = ReceiveShared(ctx, b, 4096, 0)
	if err != nil {
		t.Fatalf("a buffer of AllocShared: %v", err)
	}
	if err := buf.Free(); err != nil {
		t.Fatal(err)
	}
}
