//go:build linux

// A minimal io_uring for reads into registered buffers, by raw system
// calls through golang.org/x/sys/unix (no cgo): BenchmarkPageCacheRead and
// BenchmarkDirectRead measure it against the loader's parallel pread. It is
// test code: measured so far (2 vCPUs, a virtual disk) it does not beat
// pread with as many requests in flight, so the loader does not use it;
// the benchmarks run as they are on a host with NVMe to check again. (The maintained
// pure-Go io_uring libraries carry networking, polling and a runtime of
// their own, far more than a read needs.)

package load

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/hostptr"
)

// Constants of linux/io_uring.h.
const (
	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	featSingleMmap = 1 << 0

	opReadFixed = 4
	opRead      = 22

	enterGetEvents = 1 << 0

	registerBuffers = 0

	sqeSize = 64
	cqeSize = 16
	// paramsSize is sizeof(struct io_uring_params): ten 32-bit fields, then
	// the SQ and CQ ring offsets, 40 bytes each.
	paramsSize = 120
)

// uringRing is an io_uring instance: a submission and a completion queue.
type uringRing struct {
	fd      int
	ring    []byte // the SQ and CQ rings (one mapping)
	sqes    []byte
	entries uint32

	sqHead, sqTail, sqMask *uint32
	sqArray                []uint32
	cqHead, cqTail, cqMask *uint32
	cqes                   []byte

	queued   uint32 // SQEs written and not yet submitted
	inFlight int    // submitted and not yet reaped
}

// uringCompletion is the result of one request: Tag as given to Read, and Res
// the bytes read or a negative errno.
type uringCompletion struct {
	Tag uint64
	Res int32
}

// newURing sets up a ring of entries submission slots (a power of two from 1
// to 4096). An error matching unix.ENOSYS or unix.EPERM means io_uring is
// not available here (an old kernel, or disabled by sysctl or seccomp).
func newURing(entries uint32) (*uringRing, error) {
	if entries == 0 || entries > 4096 || entries&(entries-1) != 0 {
		return nil, fmt.Errorf("io_uring: %d entries, want a power of two up to 4096", entries)
	}
	params := make([]byte, paramsSize)
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), hostptr.AddrOf(params), 0)
	runtime.KeepAlive(params)
	if e != 0 {
		return nil, fmt.Errorf("io_uring: io_uring_setup: %w", e)
	}
	r := &uringRing{fd: int(fd)}
	if err := r.mapRings(params); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *uringRing) mapRings(params []byte) error {
	u32 := func(off int) uint32 { return binary.LittleEndian.Uint32(params[off:]) }
	sqEntries, cqEntries, features := u32(0), u32(4), u32(20)
	const sqOff, cqOff = 40, 80
	sqHead, sqTail, sqMask, sqArray := u32(sqOff), u32(sqOff+4), u32(sqOff+8), u32(sqOff+24)
	cqHead, cqTail, cqMask, cqes := u32(cqOff), u32(cqOff+4), u32(cqOff+8), u32(cqOff+20)
	sqLen := int(sqArray) + int(sqEntries)*4
	cqLen := int(cqes) + int(cqEntries)*cqeSize
	if features&featSingleMmap == 0 {
		return errors.New("io_uring: the kernel lacks IORING_FEAT_SINGLE_MMAP (Linux 5.4)")
	}
	n := max(sqLen, cqLen)
	var err error
	if r.ring, err = unix.Mmap(r.fd, offSQRing, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("io_uring: mapping the rings: %w", err)
	}
	if r.sqes, err = unix.Mmap(r.fd, offSQEs, int(sqEntries)*sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("io_uring: mapping the SQEs: %w", err)
	}
	word := func(off uint32) *uint32 { return &hostptr.SliceAt[uint32](hostptr.PtrOf(r.ring[off:off+4]), 1)[0] }
	r.entries = sqEntries
	r.sqHead, r.sqTail, r.sqMask = word(sqHead), word(sqTail), word(sqMask)
	r.sqArray = hostptr.SliceAt[uint32](hostptr.PtrOf(r.ring[sqArray:]), uintptr(sqEntries))
	r.cqHead, r.cqTail, r.cqMask = word(cqHead), word(cqTail), word(cqMask)
	r.cqes = r.ring[cqes : int(cqes)+int(cqEntries)*cqeSize]
	return nil
}

// Register registers bufs with the ring (IORING_REGISTER_BUFFERS) so that
// ReadFixed can read into them without the kernel pinning their pages at
// every request. The buffers must stay mapped until Close.
func (r *uringRing) Register(bufs [][]byte) error {
	iov := make([]unix.Iovec, len(bufs))
	for i, b := range bufs {
		iov[i].Base = &b[0]
		iov[i].SetLen(len(b))
	}
	_, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerBuffers,
		uintptr(hostptr.PtrOf(hostptr.AsBytes(iov))), uintptr(len(iov)), 0, 0)
	runtime.KeepAlive(iov)
	runtime.KeepAlive(bufs)
	if e != 0 {
		return fmt.Errorf("io_uring: registering %d buffers: %w", len(bufs), e)
	}
	return nil
}

// Read queues a read of len(buf) bytes at off of the file fd into buf;
// with index >= 0 buf lies in the registered buffer of that index
// (IORING_OP_READ_FIXED). It returns false when the submission queue is
// full (Submit first). buf must stay untouched until its completion.
func (r *uringRing) Read(fd int, buf []byte, off int64, index int, tag uint64) bool {
	head := atomic.LoadUint32(r.sqHead)
	tail := *r.sqTail + r.queued
	if tail-head >= r.entries {
		return false
	}
	i := tail & *r.sqMask
	sqe := r.sqes[i*sqeSize : (i+1)*sqeSize]
	clear(sqe)
	op := byte(opRead)
	if index >= 0 {
		op = opReadFixed
		binary.LittleEndian.PutUint16(sqe[40:], uint16(index))
	}
	sqe[0] = op
	binary.LittleEndian.PutUint32(sqe[4:], uint32(int32(fd)))
	binary.LittleEndian.PutUint64(sqe[8:], uint64(off))
	binary.LittleEndian.PutUint64(sqe[16:], uint64(hostptr.AddrOf(buf)))
	binary.LittleEndian.PutUint32(sqe[24:], uint32(len(buf)))
	binary.LittleEndian.PutUint64(sqe[32:], tag)
	r.sqArray[i] = i
	r.queued++
	return true
}

// Submit hands the queued requests to the kernel and waits until at least
// wait requests have completed (0: does not wait).
func (r *uringRing) Submit(wait int) error {
	n := r.queued
	atomic.StoreUint32(r.sqTail, *r.sqTail+n)
	r.queued = 0
	r.inFlight += int(n)
	wait = min(wait, r.inFlight)
	for {
		flags := uintptr(0)
		if wait > 0 {
			flags = enterGetEvents
		}
		got, _, e := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n), uintptr(wait), flags, 0, 0)
		if e == unix.EINTR {
			n -= uint32(got)
			continue
		}
		if e != 0 {
			return fmt.Errorf("io_uring: io_uring_enter: %w", e)
		}
		return nil
	}
}

// Reap appends the completions that have arrived to cs and returns it.
func (r *uringRing) Reap(cs []uringCompletion) []uringCompletion {
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail)
	for ; head != tail; head++ {
		c := r.cqes[(head&*r.cqMask)*cqeSize:]
		cs = append(cs, uringCompletion{Tag: binary.LittleEndian.Uint64(c), Res: int32(binary.LittleEndian.Uint32(c[8:]))})
		r.inFlight--
	}
	atomic.StoreUint32(r.cqHead, head)
	return cs
}

// InFlight returns how many submitted requests have not been reaped.
func (r *uringRing) InFlight() int { return r.inFlight }

// Close unmaps the rings and closes the ring's descriptor (which also
// unregisters its buffers).
func (r *uringRing) Close() error {
	var errs []error
	for _, m := range [][]byte{r.sqes, r.ring} {
		if m != nil {
			errs = append(errs, unix.Munmap(m))
		}
	}
	r.sqes, r.ring = nil, nil
	if r.fd >= 0 {
		errs = append(errs, unix.Close(r.fd))
		r.fd = -1
	}
	return errors.Join(errs...)
}

// TestURingReads reads a file in pieces through a ring, into registered
// buffers and into plain ones, and checks every byte and completion.
func TestURingReads(t *testing.T) {
	r, err := newURing(8)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		t.Skipf("io_uring unavailable: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data := make([]byte, 1<<20+123)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const piece = 64 << 10
	bufs := [][]byte{make([]byte, piece), make([]byte, piece), make([]byte, piece)}
	if err := r.Register(bufs[:2]); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(data))
	for off := 0; off < len(data); off += 3 * piece {
		n := 0
		for k := range 3 {
			o := off + k*piece
			if o >= len(data) {
				break
			}
			index := k
			if k == 2 {
				index = -1 // not registered
			}
			if !r.Read(int(f.Fd()), bufs[k], int64(o), index, uint64(k)) {
				t.Fatal("submission queue full")
			}
			n++
		}
		if err := r.Submit(n); err != nil {
			t.Fatal(err)
		}
		var cs []uringCompletion
		for len(cs) < n {
			cs = r.Reap(cs)
			if len(cs) < n {
				if err := r.Submit(n - len(cs)); err != nil {
					t.Fatal(err)
				}
			}
		}
		res := make([]int32, 3)
		for _, c := range cs {
			res[c.Tag] = c.Res
		}
		for k := range n {
			if res[k] < 0 {
				t.Fatalf("read %d: errno %d", k, -res[k])
			}
			got = append(got, bufs[k][:res[k]]...)
		}
	}
	if !bytes.Equal(got, data) || r.InFlight() != 0 {
		t.Errorf("read %d bytes back, %d in flight; want the file's %d", len(got), r.InFlight(), len(data))
	}
	if _, err := newURing(3); err == nil {
		t.Error("newURing(3) accepted")
	}
}
