// Command kvremote moves KV-cache blocks between two processes the way a
// prefill engine hands them to a decode engine, or a CPU-side KV store
// serves an engine: an offloader process keeps named blocks in pinned
// memory and serves them through package remote (UCX); a loader process
// pulls the blocks it needs, by name, into its own pinned memory with one
// Get of a block list, checks every byte, and copies them onto its GPU with
// a blocks.Copier (with no GPU it stops at host memory and says so). It
// runs over shared memory and over TCP on 127.0.0.1.
//
// kvremote is the loader: it starts the offloader itself (the same program
// with -serve) once per transport.
//
//	kvremote [-transport shm|tcp|both] [-blocks 512] [-kib 64] [-load 128]
//
// It needs the NVIDIA driver (pinned memory) and UCX's libucp.so.0
// (Debian/Ubuntu: apt-get install libucx0).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/blocks"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/examples/internal/harness"
	"github.com/pinmem/pinmem/remote"
)

type config struct {
	transports []string
	blocks     int // blocks the offloader keeps
	blockSize  int
	load       int  // blocks the loader pulls
	serve      bool // run as the offloader
	// offloader starts the offloader with args (this program by default).
	offloader func(args ...string) *exec.Cmd
}

// transports: UCX_TLS and UCX_NET_DEVICES of each.
var transports = map[string][2]string{"shm": {"posix,self", "all"}, "tcp": {"tcp,self", "lo"}}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := harness.Flags("kvremote", stderr)
	tr := fs.String("transport", "both", "shm, tcp or both")
	n := fs.Int("blocks", 512, "blocks the offloader keeps")
	kib := fs.Int("kib", 64, "block size in KiB")
	load := fs.Int("load", 128, "blocks the loader pulls")
	serve := fs.Bool("serve", false, "run as the offloader (kvremote starts it)")
	if err := harness.Parse(fs, args); err != nil {
		return config{}, err
	}
	cfg := config{blocks: *n, blockSize: *kib << 10, load: *load, serve: *serve, offloader: self}
	switch *tr {
	case "both":
		cfg.transports = []string{"shm", "tcp"}
	case "shm", "tcp":
		cfg.transports = []string{*tr}
	default:
		return config{}, fmt.Errorf("unknown -transport %q", *tr)
	}
	if *n <= 0 || *kib <= 0 || *load <= 0 || *load > *n {
		return config{}, errors.New("-blocks, -kib and -load must be positive, -load at most -blocks")
	}
	return cfg, nil
}

func self(args ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return exec.Command(exe, args...)
}

func main() {
	harness.Main("kvremote", parseFlags, func(cfg config) error {
		if cfg.serve {
			return serve(cfg, os.Stdin, os.Stdout)
		}
		return load(context.Background(), cfg, os.Stdout)
	})
}

// name is block i's name, and fill its content: what the offloader stores
// and the loader checks.
func name(i int) string { return fmt.Sprintf("layer%02d/seq%04d", i%32, i/32) }

func fill(b []byte, name string) {
	var seed uint64
	for _, c := range name {
		seed = seed*131 + uint64(c)
	}
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// announce is the offloader's first line: the key of its pool and where
// each named block sits in it.
type announce struct {
	Key       string         `json:"key"` // hex
	BlockSize int            `json:"block_size"`
	Slots     map[string]int `json:"slots"`
}

// serve is the offloader: the blocks in shuffled slots of a pinned pool,
// registered once, announced on out; it serves until in closes.
// (Without the driver there is no pinned memory: Alloc fails with
// cuda.ErrNoDriver, as pinmem.Alloc would.)
func serve(cfg config, in io.Reader, out io.Writer) (err error) {
	a, err := remote.NewAgent() // UCX_TLS and UCX_NET_DEVICES from the environment
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, a.Close(context.Background())) }()
	// The pool: pinned memory the transport allocates (remote.Agent.Alloc),
	// which the loader's agent maps and copies from directly over shared
	// memory.
	r, err := a.Alloc(context.Background(), cfg.blocks*cfg.blockSize)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	pool := r.Bytes()
	slots := map[string]int{}
	for i, s := range rand.New(rand.NewPCG(1, 2)).Perm(cfg.blocks) {
		slots[name(i)] = s
		fill(pool[s*cfg.blockSize:][:cfg.blockSize], name(i))
	}
	line, err := json.Marshal(announce{Key: hex.EncodeToString(r.Key()), BlockSize: cfg.blockSize, Slots: slots})
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(out, "%s\n", line); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, in) // serve until the loader is done
	return err
}

// load runs the offloader over each transport and pulls blocks from it.
func load(ctx context.Context, cfg config, w io.Writer) error {
	for _, tr := range cfg.transports {
		if err := loadOver(ctx, cfg, tr, w); err != nil {
			return fmt.Errorf("%s: %w", tr, err)
		}
	}
	return nil
}

func loadOver(ctx context.Context, cfg config, tr string, w io.Writer) (err error) {
	tls := transports[tr]
	// Pinned memory first: without the driver there is none, and the
	// program says so before it starts anything.
	bs := cfg.blockSize
	local, err := pinmem.Alloc(cfg.load*bs, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, local.Free()) }()
	cmd := cfg.offloader("-serve", "-blocks", strconv.Itoa(cfg.blocks), "-kib", strconv.Itoa(cfg.blockSize>>10), "-load", "1")
	cmd.Env = append(cmd.Environ(), "UCX_TLS="+tls[0], "UCX_NET_DEVICES="+tls[1])
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		stdin.Close() // the offloader exits when its input closes
		if werr := cmd.Wait(); werr != nil {
			err = errors.Join(err, fmt.Errorf("the offloader: %w", werr))
		}
	}()
	var ann announce
	if err := json.NewDecoder(bufio.NewReader(stdout)).Decode(&ann); err != nil {
		return fmt.Errorf("the offloader's announcement: %w", err)
	}
	key, err := hex.DecodeString(ann.Key)
	if err != nil {
		return err
	}

	a, err := remote.NewAgent(remote.WithUCX("TLS", tls[0]), remote.WithUCX("NET_DEVICES", tls[1]))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, a.Close(ctx)) }()
	pool, err := a.Import(ctx, key)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, pool.Close()) }()
	if ann.BlockSize != bs {
		return fmt.Errorf("the offloader keeps blocks of %d bytes, not %d", ann.BlockSize, bs)
	}
	region, err := a.Register(ctx, local.Bytes())
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, region.Close()) }()

	// The blocks a request needs, by name: every third block, in the
	// request's order; one Get pulls them all into consecutive slots.
	var names []string
	var list []remote.Block
	for i := 0; len(names) < cfg.load; i++ {
		n := name((i * 3) % cfg.blocks)
		slot, ok := ann.Slots[n]
		if !ok {
			return fmt.Errorf("the offloader has no block %q", n)
		}
		list = append(list, remote.Block{Local: int64(len(names) * bs), Remote: int64(slot * bs), Len: int64(bs)})
		names = append(names, n)
	}
	t0 := time.Now()
	if err := pool.Get(ctx, region, list); err != nil {
		return err
	}
	secs := time.Since(t0).Seconds()
	want := make([]byte, bs)
	for i, n := range names {
		fill(want, n)
		if !bytes.Equal(local.Bytes()[i*bs:][:bs], want) {
			return fmt.Errorf("block %q came in with other bytes", n)
		}
	}
	fmt.Fprintf(w, "%s: pulled %d named blocks of %d KiB from the offloader process in one Get: %.2f GB/s, every byte checked\n",
		tr, len(names), bs>>10, float64(len(names)*bs)/secs/1e9)
	return toGPU(ctx, local.Bytes(), names, bs, w)
}

// toGPU copies the loaded blocks onto the GPU with one blocks.Copier call
// and checks them there; without a GPU it says so and stops.
func toGPU(ctx context.Context, host []byte, names []string, bs int, w io.Writer) (err error) {
	dev, err := cuda.GetDevice(0)
	if errors.Is(err, cuda.ErrNoDevice) {
		fmt.Fprintln(w, "no GPU: the blocks stay in host memory")
		return nil
	}
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}
	kv, err := gpu.Alloc(len(host))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, kv.Free()) }()
	stream, err := gpu.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stream.Destroy()) }()
	bc, err := blocks.New(gpu)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, bc.Close(ctx)) }()
	// GPU slots in reverse order, as a free list might hand them out.
	list := make([]blocks.Block, len(names))
	for i := range names {
		list[i] = blocks.Block{Host: host[i*bs:][:bs], Dev: kv, Off: (len(names) - 1 - i) * bs}
	}
	if _, err := bc.Copy(ctx, blocks.ToDevice(stream, list)); err != nil {
		return errors.Join(err, stream.Synchronize(ctx))
	}
	if err := stream.Synchronize(ctx); err != nil {
		return err
	}
	got, want := make([]byte, bs), make([]byte, bs)
	for i, n := range names {
		if _, err := kv.ReadAt(got, int64((len(names)-1-i)*bs)); err != nil {
			return err
		}
		fill(want, n)
		if !bytes.Equal(got, want) {
			return fmt.Errorf("block %q reached the GPU with other bytes", n)
		}
	}
	devName, _ := dev.Name()
	fmt.Fprintf(w, "copied the %d blocks onto %s with one blocks.Copier call, every byte checked\n", len(names), devName)
	return nil
}
