// Package remotebench measures package remote's transport between two
// processes (this one and a copy of its own binary started as the peer)
// beside UCX's own ucx_perftest -t ucp_put_bw on the same transport in the
// same run, and reports ratios. pinmem bench remote is its command.
package remotebench

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/units"
	"github.com/pinmem/pinmem/remote"
)

// Transport is a UCX transport selection: UCX_TLS and UCX_NET_DEVICES.
type Transport struct {
	Name, TLS, Devices string
}

// Transports are the transports measured by default: shared memory and
// TCP on the loopback interface (add rc or dc where a NIC is present).
var Transports = []Transport{
	{Name: "shm", TLS: "posix,self", Devices: "all"},
	{Name: "tcp", TLS: "tcp,self", Devices: "lo"},
	{Name: "sm", TLS: "sm,self", Devices: "all"}, // every shared-memory transport UCX has: posix, sysv, cma (and knem, xpmem where loaded)
}

// Config says what to measure.
type Config struct {
	Transports []Transport
	Sizes      []int64 // block sizes
	Lists      []int   // blocks per Put
	MaxBytes   int64   // bytes per Put at most (a list is cut to fit; the row says so)
	Samples    int     // timed Puts per row (the median is reported)
	RegBytes   int64   // bytes registered for the registration-time row
	Perftest   string  // the ucx_perftest binary; "" skips the reference
}

// Row is one measurement.
type Row struct {
	Transport string
	What      string // "put[-alloc][-same]" (remote.Put of a block list), "ucx_perftest" or "register"
	Size      int64  // block size
	Blocks    int    // blocks per call
	GBps      float64
	Ratio     float64 // put: against ucx_perftest at the same size and transport (0: none)
	SecPerGiB float64 // register: seconds per GiB
	Note      string
}

// memory returns how this process gets pinmem memory: the CUDA driver, or,
// where there is none, the fake driver (plain mmap memory: UCX over shared
// memory and TCP copies it with the CPU, so page-locking changes nothing
// there) and a note saying so.
func memory() (note string, restore func(), err error) {
	if _, err := cuda.GetDevice(0); !errors.Is(err, cuda.ErrNoDriver) && !errors.Is(err, cuda.ErrNoDevice) {
		return "", func() {}, nil
	}
	r, err := fakedrv.Install(fakedrv.New(fakedrv.Options{}), "pinmem bench remote")
	if err != nil {
		return "", nil, err
	}
	return "no CUDA driver: host memory not page-locked (the fake driver's mmap)", r, nil
}

// ServePeer is the peer: it registers n bytes of pinmem memory and
// allocates n more with remote.Agent.Alloc, prints their keys in hex on two
// lines of stdout, and serves until stdin closes.
func ServePeer(n int) error {
	_, restore, err := memory()
	if err != nil {
		return err
	}
	defer restore()
	a, err := remote.NewAgent() // UCX_TLS, UCX_NET_DEVICES from the environment
	if err != nil {
		return err
	}
	defer a.Close(context.Background())
	b, err := pinmem.Alloc(n, 0)
	if err != nil {
		return err
	}
	defer b.Free()
	r, err := a.Register(context.Background(), b.Bytes())
	if err != nil {
		return err
	}
	defer r.Close()
	ra, err := a.Alloc(context.Background(), n)
	if err != nil {
		return err
	}
	defer ra.Close()
	fmt.Println(hex.EncodeToString(r.Key()))
	fmt.Println(hex.EncodeToString(ra.Key()))
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// Run measures cfg. The peer is peer(n) run as a command: a program that
// calls ServePeer(n).
// It returns the rows and a note on the memory measured ("" for pinned
// memory from the CUDA driver).
func Run(ctx context.Context, cfg Config, peer func(n int64) *exec.Cmd, progress func(string)) ([]Row, string, error) {
	note, restore, err := memory()
	if err != nil {
		return nil, "", err
	}
	defer restore()
	var rows []Row
	for _, tr := range cfg.Transports {
		rs, err := runTransport(ctx, cfg, peer, tr, progress)
		rows = append(rows, rs...)
		if err != nil {
			return rows, note, fmt.Errorf("%s: %w", tr.Name, err)
		}
	}
	return rows, note, nil
}

func runTransport(ctx context.Context, cfg Config, peerCmd func(int64) *exec.Cmd, tr Transport, progress func(string)) ([]Row, error) {
	env := append(os.Environ(), "UCX_TLS="+tr.TLS, "UCX_NET_DEVICES="+tr.Devices)
	var rows []Row
	ref := map[int64]float64{}
	if cfg.Perftest != "" {
		for _, s := range cfg.Sizes {
			progress(fmt.Sprintf("%s: ucx_perftest -t ucp_put_bw -s %d", tr.Name, s))
			gb, err := perftest(ctx, cfg.Perftest, env, s, cfg.MaxBytes)
			if err != nil {
				return rows, err
			}
			ref[s] = gb
			rows = append(rows, Row{Transport: tr.Name, What: "ucx_perftest", Size: s, Blocks: 1, GBps: gb, Note: "ucp_put_bw, overall"})
		}
	}
	a, err := remote.NewAgent(remote.WithUCX("TLS", tr.TLS), remote.WithUCX("NET_DEVICES", tr.Devices))
	if err != nil {
		return rows, err
	}
	defer a.Close(context.Background())
	rr, err := registration(ctx, a, cfg.RegBytes)
	if err != nil {
		return rows, err
	}
	rr.Transport = tr.Name
	rows = append(rows, rr)

	n := cfg.MaxBytes
	peer, keys, err := startPeer(peerCmd(n), env)
	if err != nil {
		return rows, err
	}
	defer peer.stop()
	var rems [2]*remote.Remote // the peer's pinmem region, its Alloc region
	for i, key := range keys {
		if rems[i], err = a.Import(ctx, key); err != nil {
			return rows, err
		}
		defer rems[i].Close()
	}
	buf, err := pinmem.Alloc(int(n), 0)
	if err != nil {
		return rows, err
	}
	defer buf.Free()
	clear(buf.Bytes())
	local, err := a.Register(ctx, buf.Bytes())
	if err != nil {
		return rows, err
	}
	defer local.Close()
	for _, s := range cfg.Sizes {
		for _, k := range cfg.Lists {
			count := int(min(int64(k), n/s))
			for _, v := range []struct {
				alloc, same bool
			}{{false, false}, {false, true}, {true, false}, {true, true}} {
				what, blocks, rem, same := "put", scatter(count, s, n), rems[0], v.same
				if v.alloc {
					what, rem = "put-alloc", rems[1]
				}
				if same {
					// ucx_perftest's pattern: every message from and to the
					// same addresses (so both sides stay in the CPU's caches
					// where they fit).
					what += "-same"
					clear(blocks)
					for i := range blocks {
						blocks[i].Len = s
					}
				}
				progress(fmt.Sprintf("%s: %s %d blocks of %d bytes", tr.Name, what, count, s))
				gb, err := timePuts(ctx, rem, local, blocks, cfg.Samples)
				if err != nil {
					return rows, err
				}
				row := Row{Transport: tr.Name, What: what, Size: s, Blocks: count, GBps: gb}
				if count < k {
					row.Note = fmt.Sprintf("list of %d cut to %d (--max-bytes)", k, count)
				}
				if r := ref[s]; r > 0 {
					row.Ratio = row.GBps / r
				}
				rows = append(rows, row)
			}
		}
	}
	return rows, nil
}

// timePuts returns the GB/s of the median of samples Puts of blocks (after
// one warm-up).
func timePuts(ctx context.Context, rem *remote.Remote, local *remote.Region, blocks []remote.Block, samples int) (float64, error) {
	var times []time.Duration
	for i := range samples + 1 {
		t0 := time.Now()
		if err := rem.Put(ctx, local, blocks); err != nil {
			return 0, err
		}
		if i > 0 {
			times = append(times, time.Since(t0))
		}
	}
	slices.Sort(times)
	var bytes int64
	for _, b := range blocks {
		bytes += b.Len
	}
	return float64(bytes) / times[len(times)/2].Seconds() / 1e9, nil
}

// scatter places count blocks of s bytes at shuffled slots of an n-byte
// region on each side (different shuffles).
func scatter(count int, s, n int64) []remote.Block {
	slots := int(n / s)
	lp, rp := rand.Perm(slots), rand.Perm(slots)
	blocks := make([]remote.Block, count)
	for i := range blocks {
		blocks[i] = remote.Block{Local: int64(lp[i]) * s, Remote: int64(rp[i]) * s, Len: s}
	}
	return blocks
}

// registration times Register and Close of a fresh buffer of n bytes
// (its pages touched first), as seconds per GiB.
func registration(ctx context.Context, a *remote.Agent, n int64) (Row, error) {
	b, err := pinmem.Alloc(int(n), 0)
	if err != nil {
		return Row{}, err
	}
	defer b.Free()
	clear(b.Bytes())
	t0 := time.Now()
	r, err := a.Register(ctx, b.Bytes())
	if err != nil {
		return Row{}, err
	}
	d := time.Since(t0)
	regs := len(r.Registrations())
	if err := r.Close(); err != nil {
		return Row{}, err
	}
	return Row{What: "register", Size: n, Blocks: regs, SecPerGiB: d.Seconds() / (float64(n) / (1 << 30)),
		Note: fmt.Sprintf("%v for %s in %d registrations (BLOCKS)", d.Round(time.Microsecond), size(n), regs)}, nil
}

type peerProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
}

func (p *peerProc) stop() {
	p.in.Close()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func startPeer(cmd *exec.Cmd, env []string) (*peerProc, [][]byte, error) {
	cmd.Env = append(slices.Clone(env), cmd.Env...) // the command's own variables last: they win
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	p := &peerProc{cmd: cmd, in: in}
	lines := make(chan []string, 1)
	go func() {
		r := bufio.NewReader(out)
		var ls []string
		for range 2 {
			s, _ := r.ReadString('\n')
			ls = append(ls, strings.TrimSpace(s))
		}
		lines <- ls
	}()
	select {
	case ls := <-lines:
		var keys [][]byte
		for _, s := range ls {
			key, err := hex.DecodeString(s)
			if err != nil || len(key) == 0 {
				p.stop()
				return nil, nil, fmt.Errorf("the peer process sent no key (%q)", s)
			}
			keys = append(keys, key)
		}
		return p, keys, nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		p.stop()
		return nil, nil, errors.New("the peer process sent no keys in 30 s")
	}
}

// perftest runs ucx_perftest -t ucp_put_bw with messages of s bytes, a
// server and a client on 127.0.0.1, and returns the client's overall
// bandwidth in GB/s (it prints MB/s of 2^20 bytes).
func perftest(ctx context.Context, bin string, env []string, s, total int64) (float64, error) {
	iters := min(max(total/s, 100), 100000)
	for try := 0; ; try++ {
		port, err := freePort()
		if err != nil {
			return 0, err
		}
		args := []string{"-t", "ucp_put_bw", "-s", strconv.FormatInt(s, 10), "-n", strconv.FormatInt(iters, 10), "-p", strconv.Itoa(port)}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		srv := exec.CommandContext(cctx, bin, args...)
		srv.Env = env
		if err := srv.Start(); err != nil {
			cancel()
			return 0, err
		}
		time.Sleep(300 * time.Millisecond)
		cli := exec.CommandContext(cctx, bin, append(args, "127.0.0.1")...)
		cli.Env = env
		out, cerr := cli.CombinedOutput()
		_ = srv.Wait()
		cancel()
		if gb, ok := parsePerftest(out); ok && cerr == nil {
			return gb, nil
		}
		if try == 2 {
			return 0, fmt.Errorf("%s %s: %v\n%s", bin, strings.Join(args, " "), cerr, out)
		}
	}
}

// parsePerftest reads the overall bandwidth (MB/s, MiB) from the Final line.
func parsePerftest(out []byte) (float64, bool) {
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 7 && f[0] == "Final:" {
			mb, err := strconv.ParseFloat(f[6], 64)
			if err == nil && mb > 0 {
				return mb * (1 << 20) / 1e9, true
			}
		}
	}
	return 0, false
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Table writes rows as an aligned text table.
func Table(w io.Writer, rows []Row) {
	fmt.Fprintf(w, "%-5s %-15s %10s %7s %10s %7s  %s\n", "TRANS", "WHAT", "SIZE", "BLOCKS", "GB/s", "RATIO", "NOTE")
	for _, r := range rows {
		gb, ratio := fmt.Sprintf("%.3f", r.GBps), "-"
		if r.What == "register" {
			gb = fmt.Sprintf("%.4f s/GiB", r.SecPerGiB)
		}
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f", r.Ratio)
		}
		fmt.Fprintf(w, "%-5s %-15s %10s %7d %10s %7s  %s\n", r.Transport, r.What, size(r.Size), r.Blocks, gb, ratio, r.Note)
	}
}

func size(n int64) string { return units.FormatSize(n) }
