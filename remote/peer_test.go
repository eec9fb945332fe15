package remote

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// The two-process tests start the test binary again as the peer: with
// envPeer set, TestMain runs peerMain instead of the tests. The peer
// allocates envPeerSize bytes of pinned memory (on the fake driver: real
// host memory) filled from envPeerSeed, registers them, prints the key in
// hex on a line of stdout, and answers commands read from stdin: "sum"
// prints the CRC-32 of its buffer; end of input closes and exits.
const (
	envPeer     = "PINMEM_REMOTE_TEST_PEER"
	envPeerSize = "PINMEM_REMOTE_TEST_SIZE"
	envPeerSeed = "PINMEM_REMOTE_TEST_SEED"
	envNoLib    = "PINMEM_REMOTE_TEST_NOLIB"
)

// peerMain runs the peer role when the binary was started as one; it
// reports whether it did (the process then exits).
func peerMain() bool {
	if os.Getenv(envNoLib) == "1" {
		// Without libucp: NewAgent's error must match ErrUnavailable.
		_, err := NewAgent()
		fmt.Printf("%v %v\n", errors.Is(err, ErrUnavailable), err)
		os.Exit(0)
	}
	if os.Getenv(envPeer) != "1" {
		return false
	}
	if err := runPeer(); err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

func runPeer() error {
	n, err := strconv.Atoi(os.Getenv(envPeerSize))
	if err != nil {
		return err
	}
	seed, err := strconv.ParseUint(os.Getenv(envPeerSeed), 10, 64)
	if err != nil {
		return err
	}
	restore, err := fakedrv.Install(fakedrv.New(fakedrv.Options{}), "peer")
	if err != nil {
		return err
	}
	defer restore()
	a, err := NewAgent() // UCX_TLS and UCX_NET_DEVICES from the environment
	if err != nil {
		return err
	}
	ctx := context.Background()
	defer a.Close(ctx)
	b, err := pinmem.Alloc(n, 0)
	if err != nil {
		return err
	}
	defer b.Free()
	copy(b.Bytes(), testutil.RandomBytes(n, seed))
	r, err := a.Register(ctx, b.Bytes())
	if err != nil {
		return err
	}
	defer r.Close()
	fmt.Printf("%s\n", hex.EncodeToString(r.Key()))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "sum":
			fmt.Printf("%08x\n", crc32.ChecksumIEEE(b.Bytes()))
		default:
			return fmt.Errorf("unknown command %q", in.Text())
		}
	}
	return in.Err()
}

// peerProc is a running peer.
type peerProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
	key []byte
}

// startPeer starts a peer process over tls with a buffer of n bytes from
// seed and reads its key. It is ended at cleanup.
func startPeer(t *testing.T, tls, devices string, n int, seed uint64) *peerProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envPeer+"=1", envPeerSize+"="+strconv.Itoa(n), envPeerSeed+"="+strconv.FormatUint(seed, 10),
		"UCX_TLS="+tls, "UCX_NET_DEVICES="+devices)
	cmd.Stderr = os.Stderr
	p := &peerProc{cmd: cmd}
	if p.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.out = bufio.NewReader(out)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Error("the peer did not exit in 20 s after its input closed")
		}
	})
	line := p.line(t)
	if p.key, err = hex.DecodeString(line); err != nil {
		t.Fatalf("peer's key %q: %v", line, err)
	}
	return p
}

// line reads one line of the peer's output, bounded in time.
func (p *peerProc) line(t *testing.T) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := p.out.ReadString('\n')
		ch <- res{strings.TrimSpace(s), err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("reading the peer: %v", r.err)
		}
		return r.s
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		t.Fatal("the peer said nothing in 30 s")
	}
	return ""
}

// sum asks the peer for the CRC-32 of its buffer.
func (p *peerProc) sum(t *testing.T) string {
	t.Helper()
	if _, err := io.WriteString(p.in, "sum\n"); err != nil {
		t.Fatal(err)
	}
	return p.line(t)
}

func (p *peerProc) signal(t *testing.T, s syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		t.Fatal(err)
	}
}
