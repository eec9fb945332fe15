package remote

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"

	"golang.org/x/sys/unix"
)

// EnvRequireUCX makes a test that would skip for want of libucp fail.
const EnvRequireUCX = "PINMEM_REQUIRE_UCX"

// transports are the UCX transports the tests run over: shared memory and
// TCP on the loopback interface.
var transports = []struct{ name, tls, devices string }{
	{"shm", "posix,self", "all"},
	{"tcp", "tcp,self", "lo"},
}

// newAgent starts an agent over tls, skipping the test when libucp is
// missing (failing under PINMEM_REQUIRE_UCX=1). It is closed at cleanup,
// and must then hold nothing.
func newAgent(t *testing.T, tls, devices string, opts ...Option) *Agent {
	t.Helper()
	a, err := NewAgent(append([]Option{WithUCX("TLS", tls), WithUCX("NET_DEVICES", devices)}, opts...)...)
	if errors.Is(err, ErrUnavailable) {
		if os.Getenv(EnvRequireUCX) == "1" {
			t.Fatalf("%s=1 and UCX is unavailable: %v", EnvRequireUCX, err)
		}
		t.Skipf("UCX unavailable (install libucx0; %s=1 makes this a failure): %v", EnvRequireUCX, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Agent.Close: %v", err)
		}
		if s := a.Stats(); s.Registrations != 0 || s.Connections != 0 {
			t.Errorf("after Close the agent holds %+v", s)
		}
	})
	return a
}

// alloc returns a pinned buffer of n bytes filled from seed (on the fake
// driver: its memory is real host memory), freed at cleanup.
func alloc(t *testing.T, n int, seed uint64) *pinmem.Buffer {
	t.Helper()
	b, err := pinmem.Alloc(n, 0)
	if err != nil {
		t.Fatal(err)
	}
	copy(b.Bytes(), testutil.RandomBytes(n, seed))
	t.Cleanup(func() {
		if err := b.Free(); err != nil && !errors.Is(err, pinmem.ErrFreed) {
			t.Errorf("Free: %v", err)
		}
	})
	return b
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestTwoWorkers: two agents of one process, over each transport, put and
// get a list of blocks between their regions (split into several
// registrations on both sides, so blocks cross registrations), every byte
// checked.
func TestTwoWorkers(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			ctx := ctxT(t)
			const n = 1 << 20
			a := newAgent(t, tr.tls, tr.devices, WithMaxRegistration(256<<10))
			b := newAgent(t, tr.tls, tr.devices, WithMaxRegistration(128<<10))
			src, dst := alloc(t, n, 1), alloc(t, n, 2)
			ra, err := a.Register(ctx, src.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			rb, err := b.Register(ctx, dst.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			regs := ra.Registrations()
			if len(regs) != 4 {
				t.Fatalf("1 MiB under a 256 KiB limit: %d registrations %+v", len(regs), regs)
			}
			if _, err := os.Stat("/sys/devices/system/node/node0"); err == nil {
				for _, r := range regs {
					if r.NUMANode < 0 {
						t.Errorf("registration %+v: no NUMA node on a host that has them", r)
					}
				}
			}
			rem, err := a.Import(ctx, rb.Key())
			if err != nil {
				t.Fatal(err)
			}
			// Blocks: the first half of src goes, in 4 KiB blocks written in
			// reverse order, to the second half of dst; one block of 300000
			// bytes crosses registrations of both sides.
			var blocks []Block
			for i := int64(0); i < n/2; i += 4096 {
				blocks = append(blocks, Block{Local: n/2 - 4096 - i, Remote: n/2 + n/2 - 4096 - i, Len: 4096})
			}
			blocks = append(blocks, Block{Local: 100, Remote: 7, Len: 300000})
			want := append([]byte(nil), dst.Bytes()...)
			for _, bl := range blocks {
				copy(want[bl.Remote:bl.Remote+bl.Len], src.Bytes()[bl.Local:bl.Local+bl.Len])
			}
			if err := rem.Put(ctx, ra, blocks); err != nil {
				t.Fatal(err)
			}
			testutil.CheckBytes(t, want, dst.Bytes())
			// Get back the second half of dst into src's second half.
			if err := rem.Get(ctx, ra, []Block{{Local: n / 2, Remote: n / 2, Len: n / 2}}); err != nil {
				t.Fatal(err)
			}
			testutil.CheckBytes(t, dst.Bytes()[n/2:], src.Bytes()[n/2:])
			if err := rem.Close(); err != nil {
				t.Fatal(err)
			}
			for _, r := range []*Region{ra, rb} {
				if err := r.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if s := a.Stats(); s.Registrations != 0 || s.Connections != 0 {
				t.Fatalf("after closing everything agent a holds %+v", s)
			}
		})
	}
}

// TestNoLibrary: without libucp (PINMEM_LIBUCP names a file that is not
// there), NewAgent returns an error matching ErrUnavailable that names the
// library and how to install it. It runs in a child process: the library
// is loaded once per process.
func TestNoLibrary(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envNoLib+"=1", "PINMEM_LIBUCP="+t.TempDir()+"/libucp.so.0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), "true ") || !strings.Contains(string(out), "libucx0") {
		t.Fatalf("NewAgent without libucp: %s", out)
	}
}

// TestPostAfterCloseWritesNothing: a job posted after the agent's thread
// ended (a wait whose context ended as the agent closed posts one) does
// not write its wake-up into the descriptor number the agent closed,
// which the process may have reused for another file.
func TestPostAfterCloseWritesNothing(t *testing.T) {
	a := newAgent(t, "tcp,self", "lo")
	wake := a.wake
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Another file takes the descriptor number the agent closed.
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	if err := unix.Dup3(efd, wake, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(wake)
	a.post(func() {}, true)
	var buf [8]byte
	if n, err := unix.Read(efd, buf[:]); err == nil {
		t.Fatalf("post after Close wrote %d bytes into descriptor %d, now another file's", n, wake)
	}
}

// TestCloseEndedContextIdle: Close with a context that has already ended,
// on an agent with no transfer in flight, tears the agent down and
// returns nil: no transfer was cut short (its error would say one was).
func TestCloseEndedContextIdle(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	a := newAgent(t, "tcp,self", "lo")
	buf := alloc(t, 1<<16, 1)
	if _, err := a.Register(context.Background(), buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.Close(ended); err != nil {
		t.Fatalf("Close of an idle agent with an ended context: %v, want nil", err)
	}
	if s := a.Stats(); s != (Stats{}) {
		t.Fatalf("after Close the agent holds %+v", s)
	}
}

// TestCloseRacingRegionReads: Region.Key and Region.Registrations, safe
// for concurrent use, may run while the agent closes (its teardown drops
// the regions' registrations): under -race, no data race.
func TestCloseRacingRegionReads(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	a := newAgent(t, "tcp,self", "lo")
	buf := alloc(t, 1<<16, 1)
	r, err := a.Register(context.Background(), buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = r.Key()
			_ = r.Registrations()
		}
	}()
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-read
	if regs := r.Registrations(); len(regs) != 0 {
		t.Fatalf("after Close the region lists %+v", regs)
	}
}

// TestBadUCXSetting: a UCX setting UCX refuses (a value it cannot parse)
// is a bad argument, matching cuda.ErrInvalidValue, not ErrUnavailable: a
// caller that falls back when UCX is missing must not do so for a typo.
func TestBadUCXSetting(t *testing.T) {
	newAgent(t, "tcp,self", "lo") // skips without UCX
	a, err := NewAgent(WithUCX("RNDV_THRESH", "not a size"))
	if a != nil {
		_ = a.Close(context.Background())
	}
	if !errors.Is(err, cuda.ErrInvalidValue) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("NewAgent with UCX_RNDV_THRESH=\"not a size\": %v, want cuda.ErrInvalidValue (not ErrUnavailable)", err)
	}
}
