package remote

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"syscall"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestTwoProcesses: this process gets a peer process's region (4 KiB
// blocks in a shuffled order) and puts it back changed, over each
// transport; every byte is checked on both sides.
func TestTwoProcesses(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			ctx := ctxT(t)
			const n = 4 << 20
			a := newAgent(t, tr.tls, tr.devices)
			p := startPeer(t, tr.tls, tr.devices, n, 7)
			rem, err := a.Import(ctx, p.key)
			if err != nil {
				t.Fatal(err)
			}
			defer rem.Close()
			local := alloc(t, n, 8)
			reg, err := a.Register(ctx, local.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close()
			const bs = 4096
			var blocks []Block
			for i := int64(0); i < n/bs; i++ {
				j := (i * 769) % (n / bs) // a permutation: 769 is prime to 1024
				blocks = append(blocks, Block{Local: i * bs, Remote: j * bs, Len: bs})
			}
			if err := rem.Get(ctx, reg, blocks); err != nil {
				t.Fatal(err)
			}
			src := testutil.RandomBytes(n, 7)
			want := make([]byte, n)
			for _, b := range blocks {
				copy(want[b.Local:b.Local+b.Len], src[b.Remote:b.Remote+b.Len])
			}
			testutil.CheckBytes(t, want, local.Bytes())
			copy(local.Bytes(), testutil.RandomBytes(n, 9))
			if err := rem.Put(ctx, reg, []Block{{Local: 0, Remote: 0, Len: n}}); err != nil {
				t.Fatal(err)
			}
			if got, want := p.sum(t), fmt.Sprintf("%08x", crc32.ChecksumIEEE(local.Bytes())); got != want {
				t.Fatalf("the peer's buffer after Put: CRC %s, want %s", got, want)
			}
		})
	}
}

// TestPeerKilled: a peer killed during a stream of transfers fails the
// transfer in flight or the next with a typed error (ErrPeer where UCX
// sees the failure, the context's deadline where it cannot: shared
// memory), in bounded time, and the agent releases everything.
func TestPeerKilled(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			const n = 16 << 20
			a, p, ctx, rem, local, reg := importPeer(t, tr.tls, tr.devices, n)
			errc := make(chan error, 1)
			first := make(chan struct{})
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				for i := 0; ; i++ {
					if err := rem.Get(ctx, reg, []Block{{Len: n}}); err != nil {
						errc <- err
						return
					}
					if i == 0 {
						close(first)
					}
				}
			}()
			select {
			case <-first:
			case err := <-errc:
				t.Fatalf("a Get failed before the peer was killed: %v", err)
			}
			p.signal(t, syscall.SIGKILL)
			start := time.Now()
			var err2 error
			select {
			case err2 = <-errc:
			case <-time.After(20 * time.Second):
				t.Fatal("no error 20 s after the peer was killed")
			}
			var e *Error
			if !errors.As(err2, &e) || !(errors.Is(err2, ErrPeer) || errors.Is(err2, context.DeadlineExceeded)) {
				t.Fatalf("after the kill: %T %v, want an *Error matching ErrPeer or the deadline", err2, err2)
			}
			t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err2)
			if err := rem.Get(ctx, reg, []Block{{Len: 4096}}); !errors.Is(err, ErrPeer) {
				t.Fatalf("a Get on the failed connection: %v, want ErrPeer", err)
			}
			if errors.Is(err2, context.DeadlineExceeded) {
				// No peer-failure handling (UCX over shared memory): the Get
				// cut short stays in flight, so its regions stay busy and the
				// buffer under the local one cannot be freed, until the
				// agent closes, which a deadline of its own bounds.
				if err := rem.Close(); !errors.Is(err, ErrBusy) {
					t.Fatalf("Close of the remote with a Get in flight: %v, want ErrBusy", err)
				}
				if err := local.Free(); !errors.Is(err, ErrBusy) {
					t.Fatalf("Free of a buffer with a Get in flight: %v, want ErrBusy", err)
				}
				cctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				if err := a.Close(cctx); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Agent.Close with a Get in flight: %v, want the deadline", err)
				}
			} else {
				if err := rem.Close(); err != nil {
					t.Fatal(err)
				}
				if err := reg.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if s := a.Stats(); s.Registrations != 0 || s.Connections != 0 {
				t.Fatalf("the agent still holds %+v", s)
			}
			if err := local.Free(); err != nil {
				t.Fatalf("Free after the agent let go: %v", err)
			}
		})
	}
}
