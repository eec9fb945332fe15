package remote

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"syscall"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// pair is two agents of one process and a region of each, b's imported
// by a.
type pair struct {
	a, b     *Agent
	ra, rb   *Region
	bufA     *pinmem.Buffer
	bufB     *pinmem.Buffer
	remote   *Remote
	transfer func() error // a 4 KiB Put from a to b
}

func newPair(t *testing.T, tls, devices string, n int) *pair {
	t.Helper()
	ctx := ctxT(t)
	p := &pair{a: newAgent(t, tls, devices), b: newAgent(t, tls, devices)}
	p.bufA, p.bufB = alloc(t, n, 1), alloc(t, n, 2)
	var err error
	if p.ra, err = p.a.Register(ctx, p.bufA.Bytes()); err != nil {
		t.Fatal(err)
	}
	if p.rb, err = p.b.Register(ctx, p.bufB.Bytes()); err != nil {
		t.Fatal(err)
	}
	if p.remote, err = p.a.Import(ctx, p.rb.Key()); err != nil {
		t.Fatal(err)
	}
	p.transfer = func() error { return p.remote.Put(ctx, p.ra, []Block{{Len: 4096}}) }
	return p
}

// TestBadKey: a truncated, corrupt, or foreign key is an *Error matching
// ErrBadKey, and importing one leaves nothing behind.
func TestBadKey(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	p := newPair(t, "tcp,self", "lo", 1<<16)
	key := p.rb.Key()
	ctx := ctxT(t)
	before := p.a.Stats()
	cases := map[string][]byte{"empty": nil, "magic only": key[:4], "one byte short": key[:len(key)-1], "half": key[:len(key)/2]}
	for _, i := range []int{4, 9, 40, len(key) / 2, len(key) - 5} {
		k := append([]byte(nil), key...)
		k[i] ^= 0x40
		cases["byte "+string(rune('0'+i%10))+" flipped"] = k
	}
	for name, k := range cases {
		_, err := p.a.Import(ctx, k)
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, ErrBadKey) {
			t.Errorf("%s: %v, want an *Error matching ErrBadKey", name, err)
		}
	}
	if after := p.a.Stats(); after != before {
		t.Fatalf("bad keys changed the agent: %+v -> %+v", before, after)
	}
}

// TestStaleKey: a key whose region was closed or whose buffer was freed,
// used to import or through a Remote imported before, and a key of an
// agent that exited, match ErrStaleKey.
func TestStaleKey(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			ctx := ctxT(t)
			p := newPair(t, tr.tls, tr.devices, 1<<16)
			key := p.rb.Key()
			if err := p.transfer(); err != nil {
				t.Fatal(err)
			}
			if err := p.rb.Close(); err != nil {
				t.Fatal(err)
			}
			if err := p.transfer(); !errors.Is(err, ErrStaleKey) {
				t.Fatalf("Put after the remote region closed: %v, want ErrStaleKey", err)
			}
			if _, err := p.a.Import(ctx, key); !errors.Is(err, ErrStaleKey) {
				t.Fatalf("Import of a closed region's key: %v, want ErrStaleKey", err)
			}
			// A region whose buffer is freed: the free drops the registration.
			rb2, err := p.b.Register(ctx, p.bufB.Bytes()[4096:])
			if err != nil {
				t.Fatal(err)
			}
			key2 := rb2.Key()
			if err := p.bufB.Free(); err != nil {
				t.Fatalf("Free of a registered idle buffer: %v", err)
			}
			if s := p.b.Stats(); s.Registrations != 0 {
				t.Fatalf("the free left %+v registered", s)
			}
			if _, err := p.a.Import(ctx, key2); !errors.Is(err, ErrStaleKey) {
				t.Fatalf("Import of a freed buffer's key: %v, want ErrStaleKey", err)
			}
			if err := rb2.Close(); !errors.Is(err, ErrClosed) && err != nil {
				t.Fatalf("Close of a region whose buffer was freed: %v", err)
			}
			// A key of a process that exited.
			peer := startPeer(t, tr.tls, tr.devices, 1<<16, 3)
			peer.in.Close()
			if err := peer.cmd.Wait(); err != nil {
				t.Fatal(err)
			}
			ctx2, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_, err = p.a.Import(ctx2, peer.key)
			var e *Error
			if !errors.As(err, &e) || !(errors.Is(err, ErrStaleKey) || errors.Is(err, context.DeadlineExceeded)) {
				t.Fatalf("Import of an exited agent's key: %T %v, want ErrStaleKey (or the deadline where UCX cannot tell)", err, err)
			}
			t.Logf("exited agent's key: %v", err)
		})
	}
}

// TestOutOfRange: blocks outside either region, of no length or with
// offsets that overflow, are refused before anything moves.
func TestOutOfRange(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	const n = 1 << 16
	p := newPair(t, "posix,self", "all", n)
	ctx := ctxT(t)
	want := append([]byte(nil), p.bufB.Bytes()...)
	for _, b := range []Block{
		{Local: 0, Remote: n - 100, Len: 101},
		{Local: n - 100, Remote: 0, Len: 101},
		{Len: 0},
		{Len: -1},
		{Local: -1, Len: 1},
		{Remote: -4096, Len: 4096},
		{Local: math.MaxInt64, Len: 1},
		{Remote: 1, Len: math.MaxInt64},
	} {
		for _, put := range []bool{true, false} {
			blocks := []Block{{Len: 4096}, b} // the good block must not move either
			var err error
			if put {
				err = p.remote.Put(ctx, p.ra, blocks)
			} else {
				err = p.remote.Get(ctx, p.ra, blocks)
			}
			if !errors.Is(err, ErrOutOfRange) {
				t.Errorf("block %+v (put %v): %v, want ErrOutOfRange", b, put, err)
			}
		}
	}
	testutil.CheckBytes(t, want, p.bufB.Bytes())
	if err := p.remote.Put(ctx, nil, nil); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("nil region: %v", err)
	}
	if _, err := p.a.Register(ctx, make([]byte, 4096)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Register of Go memory: %v, want cuda.ErrInvalidValue", err)
	}
}

// TestCutShort: a transfer from a peer that stopped (SIGSTOP) is ended by
// its context in bounded time, and a later transfer on the connection
// fails with ErrPeer until the key is imported again. UCX cannot take back
// bytes already sent, so the transfer goes on in the background: its local
// region stays busy (Free and Close refuse) while the peer is stopped, and
// an Import of the peer's key waits for it (bounded by its context); once
// the peer runs again it ends, the region is released and a new
// connection moves the right bytes.
func TestCutShort(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	const n = 8 << 20
	a, p, ctx, rem, local, reg := importPeer(t, "tcp,self", "lo", n)
	p.signal(t, syscall.SIGSTOP)
	defer p.signal(t, syscall.SIGCONT)
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := rem.Get(cctx, reg, []Block{{Len: n}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get from a stopped peer: %v, want the deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the Get returned %v after its 500 ms deadline", d)
	}
	if err := rem.Get(ctx, reg, []Block{{Len: 4096}}); !errors.Is(err, ErrPeer) {
		t.Fatalf("Get after a cut-short one: %v, want ErrPeer", err)
	}
	if err := local.Free(); err == nil {
		t.Fatal("Free of the region of a Get still in flight: nil, want a refusal (its bytes may still change)")
	}
	if err := rem.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Close with the cut-short Get in flight: %v, want ErrBusy", err)
	}
	ictx, icancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer icancel()
	if _, err := a.Import(ictx, p.key); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Import while the cut-short Get is in flight: %v, want the deadline (it waits for the Get)", err)
	}
	p.signal(t, syscall.SIGCONT)
	rem2, err := a.Import(ctx, p.key)
	if err != nil {
		t.Fatalf("Import again after SIGCONT: %v", err)
	}
	if err := rem.Close(); err != nil {
		t.Fatalf("Close once the cut-short Get ended: %v", err)
	}
	want := bytes.Repeat([]byte{0x5a}, 1<<20)
	copy(local.Bytes(), want)
	if err := rem2.Put(ctx, reg, []Block{{Len: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	clear(local.Bytes()[:1<<20])
	if err := rem2.Get(ctx, reg, []Block{{Len: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, want, local.Bytes()[:1<<20])
	if err := rem2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := local.Free(); err != nil {
		t.Fatalf("Free after the cut-short Get ended: %v", err)
	}
	if s := a.Stats(); s.Registrations != 0 || s.Connections != 0 {
		t.Fatalf("the agent holds %+v", s)
	}
}

// TestImportBesideCutShort: an Import whose connection check was in
// flight when another call on the same connection was cut short by its
// context fails with ErrPeer, import again, not ErrStaleKey: the key's
// agent is there.
func TestImportBesideCutShort(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	a := newAgent(t, "tcp,self", "lo")
	p := startPeer(t, "tcp,self", "lo", 1<<20, 5)
	ctx := ctxT(t)
	local := alloc(t, 1<<20, 6)
	reg, err := a.Register(ctx, local.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	p.signal(t, syscall.SIGSTOP)
	defer p.signal(t, syscall.SIGCONT)
	// The first Import connects and checks the connection: the stopped
	// peer does not answer, so its check stays in flight.
	first := make(chan error, 1)
	go func() {
		rem, err := a.Import(ctx, p.key)
		if err == nil {
			err = rem.Close()
		}
		first <- err
	}()
	var second *Remote
	deadline := time.Now().Add(10 * time.Second)
	for second == nil {
		time.Sleep(20 * time.Millisecond)
		select {
		case err := <-first:
			t.Fatalf("the first Import returned before the second began: %v", err)
		default:
		}
		if a.Stats().Connections == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no connection 10 s after the first Import began")
			}
			continue
		}
		// The second shares the connection (no check of its own) and is cut
		// short by its context, which fails the connection.
		if second, err = a.Import(ctx, p.key); err != nil {
			t.Fatal(err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := second.Get(cctx, reg, []Block{{Len: 4096}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get from a stopped peer: %v, want the deadline", err)
	}
	p.signal(t, syscall.SIGCONT)
	select {
	case err := <-first:
		if !errors.Is(err, ErrPeer) || errors.Is(err, ErrStaleKey) {
			t.Fatalf("Import whose connection this side failed: %v, want ErrPeer", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first Import did not return 10 s after the peer ran again")
	}
	deadline = time.Now().Add(10 * time.Second)
	for second.Close() != nil { // busy until the cut-short Get ended
		if time.Now().After(deadline) {
			t.Fatal("the cut-short Get did not end 10 s after the peer ran again")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestImportAfterPeerError: once UCX failed a connection (the peer was
// killed; TCP has peer error handling), an Import of the peer's key does
// not return a Remote on the failed connection: it connects again and its
// check fails (ErrStaleKey, or the deadline where UCX cannot tell).
func TestImportAfterPeerError(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	a, p, ctx, rem, _, reg := importPeer(t, "tcp,self", "lo", 1<<20)
	p.signal(t, syscall.SIGKILL)
	_ = p.cmd.Wait()
	if err := rem.Get(ctx, reg, []Block{{Len: 4096}}); !errors.Is(err, ErrPeer) {
		t.Fatalf("Get from a killed peer: %v, want ErrPeer", err)
	}
	ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	rem2, err := a.Import(ictx, p.key)
	if err == nil {
		_ = rem2.Close()
		t.Fatal("Import of a killed peer's key after its connection failed: a Remote, want ErrStaleKey (or the deadline)")
	}
	if !errors.Is(err, ErrStaleKey) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Import of a killed peer's key after its connection failed: %v, want ErrStaleKey (or the deadline)", err)
	}
	t.Logf("Import after the connection failed: %v", err)
	if err := rem.Close(); err != nil {
		t.Fatal(err)
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestImportAfterCutShortPeerGone: over shared memory (no peer error
// handling) a transfer cut short by its context to a peer that then died
// never ends, so the failed connection never drains: an Import of the
// dead peer's key still fails at once with ErrStaleKey, as it did before
// that transfer, rather than wait for the drain until its context ends.
func TestImportAfterCutShortPeerGone(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	a, p, ctx, rem, local, reg := importPeer(t, "posix,self", "all", 1<<20)
	p.signal(t, syscall.SIGSTOP)
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := rem.Get(cctx, reg, []Block{{Len: 1 << 20}}); !errors.Is(err, context.DeadlineExceeded) {
		p.signal(t, syscall.SIGCONT)
		t.Fatalf("Get from a stopped peer: %v, want the deadline", err)
	}
	// While the peer lives (stopped), Import waits for the cut-short Get.
	wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer wcancel()
	if _, err := a.Import(wctx, p.key); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Import of a stopped peer's key after a cut-short transfer: %v, want the deadline", err)
	}
	p.signal(t, syscall.SIGKILL)
	_ = p.cmd.Wait()
	ictx, icancel := context.WithTimeout(ctx, 5*time.Second)
	defer icancel()
	start := time.Now()
	if _, err := a.Import(ictx, p.key); !errors.Is(err, ErrStaleKey) {
		t.Errorf("Import of a dead peer's key after a cut-short transfer: %v after %v, want ErrStaleKey", err, time.Since(start).Round(time.Millisecond))
	}
	// The cut-short Get never ends: the agent's Close ends it.
	clctx, clcancel := context.WithTimeout(ctx, time.Second)
	defer clcancel()
	if err := a.Close(clctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Agent.Close with a Get in flight: %v, want the deadline", err)
	}
	if err := local.Free(); err != nil {
		t.Fatalf("Free after the agent let go: %v", err)
	}
}

// TestTransferRacingClose: a Put that passed its checks while a Close of
// its Remote was queued on the agent's thread fails with ErrClosed, as a
// Put after the Close does, not with ErrPeer (the connection is fine).
func TestTransferRacingClose(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	p := newPair(t, "tcp,self", "lo", 1<<16)
	gate, held := make(chan struct{}), make(chan struct{})
	p.a.post(func() { close(held); <-gate }, false) // holds the thread
	<-held
	queued := func(n int) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			p.a.mu.Lock()
			k := len(p.a.jobs)
			p.a.mu.Unlock()
			if k >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d jobs queued after 10 s, want %d", k, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- p.remote.Close() }()
	queued(1)
	put := make(chan error, 1)
	go func() { put <- p.transfer() }()
	queued(2)
	close(gate)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := <-put; !errors.Is(err, ErrClosed) {
		t.Fatalf("a Put queued behind its Remote's Close: %v, want ErrClosed", err)
	}
}

// TestImportCutShortReleases: an Import cut short by its context over
// shared memory (no peer error handling: its connection check stays in
// flight) leaves nothing behind once the check ends: the connection is
// closed when the peer answers, and it is counted until then, also after
// a later Import of the same key made a new connection.
func TestImportCutShortReleases(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	a := newAgent(t, "posix,self", "all")
	p := startPeer(t, "posix,self", "all", 1<<20, 5)
	ctx := ctxT(t)
	p.signal(t, syscall.SIGSTOP)
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := a.Import(cctx, p.key); !errors.Is(err, context.DeadlineExceeded) {
		p.signal(t, syscall.SIGCONT)
		t.Fatalf("Import of a stopped peer's key: %v, want the deadline", err)
	}
	if s := a.Stats(); s.Connections != 1 {
		t.Errorf("with the check in flight: %+v, want 1 connection", s)
	}
	k, err := parseKey(p.key)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	first := a.peers[string(k.worker)]
	a.mu.Unlock()
	p.signal(t, syscall.SIGCONT)
	rem, err := a.Import(ctx, p.key)
	if err != nil {
		t.Fatal(err)
	}
	if err := rem.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	open := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return first.ep != 0
	}
	for (a.Stats().Connections != 0 || open()) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s := a.Stats(); s.Connections != 0 || open() {
		t.Fatalf("5 s after the peer answered: %+v, the cut-short Import's connection open: %v", s, open())
	}
}

// importPeer starts an agent of this process and a peer process with a
// region of n bytes over UCX transports tls, imports the peer's key, and
// registers a local buffer of n bytes: the start of the fault tests.
func importPeer(t *testing.T, tls, devices string, n int) (*Agent, *peerProc, context.Context, *Remote, *pinmem.Buffer, *Region) {
	t.Helper()
	a := newAgent(t, tls, devices)
	p := startPeer(t, tls, devices, n, 5)
	ctx := ctxT(t)
	rem, err := a.Import(ctx, p.key)
	if err != nil {
		t.Fatal(err)
	}
	local := alloc(t, n, 6)
	reg, err := a.Register(ctx, local.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return a, p, ctx, rem, local, reg
}

// TestWaitCompletedBeforeLook: a transfer that has completed is reported
// as completed even when its context has ended too by the time its caller
// looks (the transfer's flush ended first), and its connection is not
// failed: nothing was cut short.
func TestWaitCompletedBeforeLook(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	p := newPair(t, "tcp,self", "lo", 1<<16)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 64 {
		o := &op{name: "remote.Put", p: p.remote.p, done: make(chan struct{})}
		close(o.done)
		if err := p.a.wait(ended, o); err != nil {
			t.Fatalf("wait %d for a completed op with an ended context: %v, want nil", i, err)
		}
	}
	if err := p.transfer(); err != nil {
		t.Fatalf("Put after completed transfers: %v", err)
	}
}

// TestForgedRkey: a key whose checksum is right but whose packed UCX
// remote key is cut short, or claims more registrations than it carries,
// matches ErrBadKey: UCX's unpack takes no length, so it must never be
// handed a remote key shorter than its own framing says (it would read
// past it, or abort the process).
func TestForgedRkey(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPair(t, tr.tls, tr.devices, 1<<16)
			ctx := ctxT(t)
			key := p.rb.Key()
			k, err := parseKey(key)
			if err != nil {
				t.Fatal(err)
			}
			at := keyHeaderSize + 4 + len(k.worker) + 4 + 16 // the first registration's rkey length
			rk := k.pieces[0].rkey
			withRkey := func(rk []byte) []byte {
				b := append([]byte(nil), key[:at]...)
				b = binary.LittleEndian.AppendUint32(b, uint32(len(rk)))
				b = append(b, rk...)
				b = append(b, key[at+4+len(k.pieces[0].rkey):len(key)-4]...)
				return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
			}
			before := p.a.Stats()
			for name, forged := range map[string][]byte{
				"one byte":     rk[:1],
				"no mem type":  rk[:8],
				"all ones":     bytes.Repeat([]byte{0xff}, len(rk)),
				"missing size": append(append([]byte{0xff, 0xff}, make([]byte, 6)...), 0),
			} {
				if _, err := p.a.Import(ctx, withRkey(forged)); !errors.Is(err, ErrBadKey) {
					t.Errorf("%s (%x): %v, want ErrBadKey", name, forged, err)
				}
			}
			if after := p.a.Stats(); after != before {
				t.Fatalf("forged keys changed the agent: %+v -> %+v", before, after)
			}
			if _, err := p.a.Import(ctx, withRkey(rk)); err != nil {
				t.Fatalf("the key rebuilt unchanged: %v", err)
			}
		})
	}
}

// TestForgedKeyLength: a key (with a right checksum) whose region is
// longer than an int64 counts is refused with ErrBadKey: Remote.Len would
// be negative and the range check of every block would overflow.
func TestForgedKeyLength(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	p := newPair(t, "tcp,self", "lo", 1<<16)
	key := p.rb.Key()
	k, err := parseKey(key)
	if err != nil {
		t.Fatal(err)
	}
	b := append([]byte(nil), key[:len(key)-4]...)
	binary.LittleEndian.PutUint64(b[32:], 1<<63)                                // the region's length
	binary.LittleEndian.PutUint64(b[keyHeaderSize+4+len(k.worker)+4+8:], 1<<63) // its one registration's
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	r, err := p.a.Import(ctxT(t), b)
	if !errors.Is(err, ErrBadKey) {
		t.Fatalf("Import of a key of 2^63 bytes: %v (Len %d), want ErrBadKey", err, r.Len())
	}
}
