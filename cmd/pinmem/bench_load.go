package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cpuclock"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/internal/units"
	"github.com/pinmem/pinmem/load"
)

func init() {
	benchSubcommands = append(benchSubcommands, newBenchLoad)
}

// Kinds of the load bench's results.
const (
	loadKindLoader   = "loader"        // package load: file to device memory
	loadKindParallel = "read-parallel" // N goroutines pread into Go memory
	loadKindDirect   = "read-direct"   // sequential O_DIRECT reads, several in flight
	loadKindBuffered = "read-buffered" // sequential buffered reads, one at a time
	loadKindPinned   = "pinned-h2d"    // one copy of pinned host memory to the device: the link's rate in this run
)

// loadKinds are every kind of the load bench's rows, the choices of --baseline.
var loadKinds = []string{loadKindLoader, loadKindParallel, loadKindDirect, loadKindBuffered,
	loadKindCheckpoint, loadKindFirst, loadKindPinned}

// dropCaches drops the page cache before a cold sample (dropPageCache);
// tests replace it.
var dropCaches = dropPageCache

// loadBenchConfig is the load bench's configuration, as the report's
// metadata records it.
type loadBenchConfig struct {
	File       string `json:"file"`
	Size       int64  `json:"size"`
	Samples    int    `json:"samples"`
	Mode       string `json:"mode"`
	Readers    int    `json:"readers"`
	Stages     int    `json:"stages"`
	StageSize  int    `json:"stage_size"`
	Streams    int    `json:"streams"`
	Depth      int    `json:"direct_depth"`
	DropCaches bool   `json:"drop_caches"`
	// Defaults: the loader ran with its own sizes (load.DefaultSettings on
	// this machine): no size flag was given.
	Defaults bool `json:"loader_defaults"`
}

func newBenchLoad() *cobra.Command {
	var f benchLoadFlags
	c := &cobra.Command{
		Use:   "load FILE",
		Short: "File to GPU: the weight loader against plain reads of the same file",
		Long: `load measures package load reading FILE into device memory (GB/s and CPU
seconds per GB of the whole process), beside the rate at which the same run
reads FILE from the page cache into Go memory with as many goroutines as the
loader has readers (no GPU): the ratio column shows how close the loader
comes to the page cache. A pinned-h2d row copies up to 256 MiB of pinned
host memory to the device, the link's rate in the same run, and the
loader's row gives its ratio to it. Unless --readers, --stages, --stage-size or
--streams is given, the loader runs with its own defaults on this machine
(load.DefaultSettings), and its rows say which sizes it used.

FILE may also be a sharded safetensors checkpoint, its directory or its
model.safetensors.index.json: then safetensors.LoadCheckpoint loads every
tensor into one device allocation, the shards in parallel (row
checkpoint), beside a parallel read of every shard; the checkpoint-first
row is the time until the first tensor is on the device. Every tensor is
verified.

With --drop-caches (as root) it also measures a cold FILE, dropping the page
cache (echo 3 > /proc/sys/vm/drop_caches) before every cold sample: the
loader, sequential O_DIRECT reads with --depth requests in flight, and
sequential buffered reads (one request at a time, the kernel's read-ahead).
Without it the cold rows are listed as skipped. For a checkpoint, the cold
rows are the disk's parallel reads of every shard at once (O_DIRECT with
--depth requests in flight per shard, and buffered with --readers
goroutines per shard) and LoadCheckpoint, whose note gives its ratio to the
better of the two.

The loader's data is verified: CRC-32C of every 64 MiB of the file, read on
the host, against the same of the device memory copied back.

` + exitHelp,
		Example: `  pinmem bench load model.safetensors
  pinmem bench load /models/llama/model.safetensors.index.json
  sudo pinmem bench load --drop-caches --samples 3 /nvme/model.safetensors --format json -o load.json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("want one FILE, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return f.run(cmd, args[0]) },
	}
	f.o.register(c, reportFormats, true)
	fl := c.Flags()
	fl.IntVar(&f.device, "device", 0, "GPU ordinal to load to")
	fl.StringVar(&f.baseline, "baseline", loadKindParallel, "the row the table's ratio column compares with: "+strings.Join(loadKinds, ", ")+" (empty: no ratio column)")
	_ = c.RegisterFlagCompletionFunc("baseline", fixedCompletion(loadKinds...))
	fl.IntVar(&f.cfg.Samples, "samples", 3, "timed samples per measurement (median, min and max are reported)")
	fl.StringVar(&f.mode, "mode", "auto", "the loader's read mode for the warm file: auto, direct, buffered or mapped (which reads buffered; cold loads use auto)")
	d := load.DefaultSettings()
	fl.IntVar(&f.cfg.Readers, "readers", d.Parallelism, "loader reader goroutines (load.WithParallelism), and goroutines of the parallel page-cache read (default: the loader's on this machine, load.DefaultSettings)")
	fl.IntVar(&f.cfg.Stages, "stages", 0, "pinned stages of the loader (load.WithDepth; 0: twice --readers)")
	fl.StringVar(&f.stageSize, "stage-size", units.FormatSize(int64(d.StageSize)), "bytes per stage and per read request (default: the loader's)")
	fl.IntVar(&f.cfg.Streams, "streams", d.Streams, "CUDA streams of the loader (default: the loader's)")
	fl.IntVar(&f.cfg.Depth, "depth", 8, "O_DIRECT requests in flight in the cold sequential read")
	fl.BoolVar(&f.cfg.DropCaches, "drop-caches", false, "measure the cold file too, dropping the page cache before each cold sample (root only)")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress bar on standard error")
	_ = c.RegisterFlagCompletionFunc("mode", fixedCompletion("auto", "direct", "buffered", "mapped"))
	return c
}

// benchLoadFlags are bench load's flags.
type benchLoadFlags struct {
	o                         output
	cfg                       loadBenchConfig
	mode, stageSize, baseline string
	device                    int
	quiet                     bool
	set                       func(flag string) bool // whether the user gave the flag
}

// run measures the file (or checkpoint) file and writes the report.
func (f *benchLoadFlags) run(cmd *cobra.Command, file string) (err error) {
	f.cfg.File = file
	f.set = func(flag string) bool { return cmd.Flags().Changed(flag) }
	opts, err := f.options()
	if err != nil {
		return err
	}
	checkpoint, err := f.checkFile()
	if err != nil {
		return err
	}
	format, err := f.o.check()
	if err != nil {
		return err
	}
	if err := checkBudgetEnv(); err != nil {
		return err
	}
	pr := newProgress(cmd.ErrOrStderr(), f.quiet, 13, "bench load") // 6 measurements of 2 results each, and the pinned reference
	s, err := bench.Open(cmd.Context(), f.device, bench.SessionConfig{Progress: pr.writer(), NoSpin: true})
	if err != nil {
		pr.done()
		return err
	}
	defer closeSession(s, &err)
	var rs []bench.Result
	var runErr error
	if checkpoint {
		rs, runErr = runCheckpointBench(cmd.Context(), s.Ctx, &f.cfg, opts, pr.writer())
	} else {
		rs, runErr = runLoadBench(cmd.Context(), s.Ctx, f.cfg, opts, pr.writer())
	}
	pr.done()
	mt := meta(s.Meta("pinmem bench load"), f.cfg)
	mt.Timing = "host wall clock around each whole load or read of the file; CPU time from getrusage(RUSAGE_SELF)"
	return f.o.emit(cmd, format, mt, rs, bench.TableOptions{Baseline: f.baseline}, runErr)
}

// options checks the flags and returns the loader's options; it fills in
// the configuration's mode, stage size and stages.
func (f *benchLoadFlags) options() ([]load.Option, error) {
	cfg := &f.cfg
	if cfg.Samples < 1 || cfg.Samples > bench.MaxSamples {
		return nil, usagef("--samples %d: must be from 1 to %d", cfg.Samples, bench.MaxSamples)
	}
	if f.device < 0 {
		return nil, usagef("--device %d: must be 0 or more", f.device)
	}
	if f.baseline != "" && !slices.Contains(loadKinds, f.baseline) {
		return nil, usagef("--baseline %q: want one of %s, or empty", f.baseline, strings.Join(loadKinds, ", "))
	}
	var m load.Mode
	if err := m.UnmarshalText([]byte(f.mode)); err != nil {
		return nil, usagef("--mode %q: want auto, direct, buffered or mapped", f.mode)
	}
	cfg.Mode = m.String()
	n, err := units.ParseSize(f.stageSize, load.MaxStageSize)
	if err != nil {
		return nil, usagef("--stage-size: %v", err)
	}
	cfg.StageSize = int(n)
	if cfg.Depth < 1 || cfg.Depth > 256 {
		return nil, usagef("--depth %d: must be from 1 to 256", cfg.Depth)
	}
	// Only the sizes the user set are passed: the rows measure the
	// loader's own defaults otherwise (load.DefaultSettings), and the
	// configuration records the values either way.
	opts := []load.Option{load.WithMode(m)}
	for _, o := range []struct {
		flag string
		opt  load.Option
	}{
		{"stage-size", load.WithStageSize(cfg.StageSize)},
		{"readers", load.WithParallelism(cfg.Readers)},
		{"streams", load.WithStreams(cfg.Streams)},
	} {
		if f.set(o.flag) {
			opts = append(opts, o.opt)
		}
	}
	if cfg.Stages != 0 { // load.New refuses a negative one below
		opts = append(opts, load.WithDepth(cfg.Stages))
	} else {
		cfg.Stages = 2 * cfg.Readers
	}
	cfg.Defaults = !f.set("stage-size") && !f.set("readers") && !f.set("streams") && !f.set("stages")
	// load.New checks its options before its context: with a nil
	// context it opens nothing, and only an option it refuses is the
	// user's error.
	if _, err := load.New(nil, opts...); errors.As(err, new(*pinmem.OptionError)) {
		return nil, usage(err)
	}
	return opts, nil
}

// checkFile checks the file to measure and reports whether it is a
// checkpoint; a single file's size goes into the configuration.
func (f *benchLoadFlags) checkFile() (checkpoint bool, err error) {
	cfg := &f.cfg
	fi, err := os.Stat(cfg.File)
	checkpoint = err == nil && isCheckpoint(cfg.File, fi)
	switch {
	case err != nil:
		return false, usagef("%s: %v", cfg.File, unwrapPath(err))
	case checkpoint:
		if shards, err := checkpointShards(cfg.File); err != nil {
			return false, usagef("%s: not a safetensors checkpoint: %v", cfg.File, err)
		} else if len(shards) == 0 {
			return false, usagef("%s: not a safetensors checkpoint: a directory with no model.safetensors.index.json and no .safetensors file", cfg.File)
		}
	case !fi.Mode().IsRegular():
		return false, usagef("%s: not a regular file", cfg.File)
	case fi.Size() == 0:
		return false, usagef("%s: the file is empty", cfg.File)
	case int64(int(fi.Size())) != fi.Size():
		return false, usagef("%s: too large for this platform", cfg.File)
	}
	if !checkpoint {
		cfg.Size = fi.Size() // a checkpoint's is its tensors' bytes, found by runCheckpointBench
	}
	if cfg.DropCaches && os.Geteuid() != 0 {
		return false, usagef("--drop-caches needs root (it writes /proc/sys/vm/drop_caches)")
	}
	return checkpoint, nil
}

// loadSample is one timed run: its wall time and the process CPU time.
type loadSample struct {
	wall, cpu time.Duration
}

// measure runs fn samples times (after before, untimed, when not nil) and
// returns the GB/s and CPU-s/GB results of kind and dir. A failing fn ends
// the measurement with the results skipped and the error noted.
func measure(ctx context.Context, kind, dir string, size int64, samples int, before func() error, fn func(i int) error, note string) ([]bench.Result, error) {
	rate := bench.Result{Bench: "load", Kind: kind, Dir: dir, Size: size, Unit: bench.GBps, Timing: bench.TimingWall, Note: note}
	cpu := rate
	cpu.Unit = bench.CPUsPerGB
	var rates, cpus []float64
	for i := range samples {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if before != nil {
			if err := before(); err != nil {
				return skippedPair(rate, cpu, err), nil
			}
		}
		c0, t0 := cpuclock.Process(), time.Now()
		err := fn(i)
		s := loadSample{time.Since(t0), cpuclock.Process() - c0}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return skippedPair(rate, cpu, err), nil
		}
		rates = append(rates, bench.Rate(size, s.wall))
		cpus = append(cpus, s.cpu.Seconds()/(float64(size)/1e9))
	}
	fill := func(r *bench.Result, v []float64) {
		sum := bench.Summarize(v)
		r.Median, r.Min, r.Max, r.Samples = sum.Median, sum.Min, sum.Max, sum.N
	}
	fill(&rate, rates)
	fill(&cpu, cpus)
	return []bench.Result{rate, cpu}, nil
}

func skippedPair(rate, cpu bench.Result, err error) []bench.Result {
	for _, r := range []*bench.Result{&rate, &cpu} {
		r.Skipped, r.Note, r.VerifyFailed = true, "error: "+err.Error(), false
	}
	return []bench.Result{rate, cpu}
}

// verifyError says that the device data differs from the file.
type verifyError struct{ msg string }

func (e *verifyError) Error() string { return e.msg }

// crcChunk is the span each checksum covers.
const crcChunk = 64 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fileCRCs returns the CRC-32C of every crcChunk bytes of the file, read
// by several goroutines (which also brings the file into the page cache).
func fileCRCs(path string, size int64, workers int) ([]uint32, error) {
	crcs := make([]uint32, (size+crcChunk-1)/crcChunk)
	err := readChunks(path, size, workers, crcChunk, func(i int64, b []byte) {
		crcs[i] = crc32.Checksum(b, castagnoli)
	})
	return crcs, err
}

// checkDevice copies dst back in crcChunk pieces and checks each against want.
func checkDevice(dst *cuda.DeviceBuffer, size int64, want []uint32) error {
	buf := make([]byte, min(crcChunk, size))
	for i, w := range want {
		off := int64(i) * crcChunk
		k := int(min(crcChunk, size-off))
		if _, err := dst.ReadAt(buf[:k], off); err != nil {
			return err
		}
		if got := crc32.Checksum(buf[:k], castagnoli); got != w {
			return &verifyError{fmt.Sprintf("bytes [%d, %d) on the device have CRC-32C %#08x, the file %#08x", off, off+int64(k), got, w)}
		}
	}
	return nil
}

// parallelRead reads the whole file with workers goroutines, each taking
// the next chunk of the file into its own Go buffer.
func parallelRead(path string, size int64, workers, chunk int) error {
	return readChunks(path, size, workers, chunk, nil)
}

// readChunks reads the file in chunk-byte pieces with workers goroutines,
// each taking the next piece into its own buffer and handing it, with its
// index, to use (when not nil) before reading the next.
func readChunks(path string, size int64, workers, chunk int, use func(i int64, b []byte)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, chunk)
			for {
				i := next.Add(1) - 1
				off := i * int64(chunk)
				if off >= size {
					return
				}
				k := int(min(int64(chunk), size-off))
				if _, err := f.ReadAt(buf[:k], off); err != nil {
					errs[w] = err
					return
				}
				if use != nil {
					use(i, buf[:k])
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// directReadAt reads from a file opened with O_DIRECT; tests replace it
// to simulate kernels that refuse some direct reads.
var directReadAt = (*os.File).ReadAt

// directRead reads the file in order with O_DIRECT, depth requests of
// chunk bytes in flight (each goroutine takes the next offset), into
// aligned Go memory. As the loader does, the direct reads stop at the
// file's last multiple of load.Align and the last partial block is read
// buffered: os.File.ReadAt follows a short read with a read at the
// unaligned end, which kernels whose direct I/O checks alignment before
// the file's size (ext4 before Linux 5.5) refuse with EINVAL.
func directRead(path string, size int64, depth, chunk int) error {
	f, err := openDirectFile(path)
	if err != nil {
		return fmt.Errorf("O_DIRECT: %w", err)
	}
	defer f.Close()
	end := size / load.Align * load.Align
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, depth+1)
	for w := range depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			raw := make([]byte, chunk+load.Align)
			skip := int((load.Align - hostptr.AddrOf(raw)%load.Align) % load.Align)
			buf := raw[skip : skip+chunk]
			for {
				off := (next.Add(1) - 1) * int64(chunk)
				if off >= end {
					return
				}
				k := int(min(int64(chunk), end-off))
				if _, err := directReadAt(f, buf[:k], off); err != nil && !errors.Is(err, io.EOF) {
					errs[w] = err
					return
				}
			}
		}()
	}
	if end < size {
		errs[depth] = readTail(path, end, size)
	}
	wg.Wait()
	return errors.Join(errs...)
}

// readTail reads the bytes [from, size) of the file buffered.
func readTail(path string, from, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.ReadAt(make([]byte, size-from), from); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// bufferedRead reads the file in order, one request of chunk bytes at a
// time.
func bufferedRead(path string, chunk int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, chunk)
	for {
		_, err := f.Read(buf)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// runLoadBench runs every measurement of the load bench.
func runLoadBench(ctx context.Context, gpu *cuda.Context, cfg loadBenchConfig, opts []load.Option, progress io.Writer) ([]bench.Result, error) {
	crcs, err := fileCRCs(cfg.File, cfg.Size, cfg.Readers)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", cfg.File, err)
	}
	dst, err := gpu.Alloc(int(cfg.Size))
	if err != nil {
		return nil, fmt.Errorf("allocating %d bytes of device memory: %w", cfg.Size, err)
	}
	defer func() { _ = dst.Free() }()
	r := &loadRun{rowLog: rowLog{progress: progress}, ctx: ctx, gpu: gpu, cfg: cfg, opts: opts, dst: dst, crcs: crcs}
	warmLoader, err := pinnedLoader(ctx, gpu, cfg, cfg.File, dst, opts...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = warmLoader.Close(ctx) }()
	if err := r.warm(warmLoader); err != nil {
		return r.rs, err
	}
	return r.rs, r.cold()
}

// loadRun is one run of the load bench: the device memory the file is
// loaded into, the file's checksums to verify it by, and the rows so far.
type loadRun struct {
	rowLog
	ctx  context.Context
	gpu  *cuda.Context
	cfg  loadBenchConfig
	opts []load.Option
	dst  *cuda.DeviceBuffer
	crcs []uint32
}

// loader returns a loader of the run's options and then extra, its
// stages pinned (pinnedLoader).
func (r *loadRun) loader(extra ...load.Option) (*load.Loader, error) {
	return pinnedLoader(r.ctx, r.gpu, r.cfg, r.cfg.File, r.dst, append(append([]load.Option{}, r.opts...), extra...)...)
}

// pinnedLoader returns a loader of opts whose stages are pinned: load.New
// pins nothing and a read pins the stage it takes, the first reads of a
// load taking every stage in turn, so a load of the ring's worth of path
// (cfg's stages times their size, at most the file and dst) into dst
// pins them here, untimed, and every timed load reuses them, as a
// server's loads after its first do. Callers clear dst before their timed
// loads; cold rows drop the page cache before each sample.
func pinnedLoader(ctx context.Context, gpu *cuda.Context, cfg loadBenchConfig, path string, dst *cuda.DeviceBuffer, opts ...load.Option) (*load.Loader, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("pinning the loader's stages: %w", err)
	}
	l, err := load.New(gpu, opts...)
	if err != nil {
		return nil, err
	}
	n := min(int64(cfg.Stages)*int64(cfg.StageSize), fi.Size(), int64(dst.Size()))
	if _, err := l.Load(ctx, path, []load.Range{{Offset: 0, Length: n, Dst: dst}}); err != nil {
		return nil, errors.Join(fmt.Errorf("pinning the loader's stages: %w", err), l.Close(ctx))
	}
	return l, nil
}

// warm measures the warm file: read in parallel into Go memory, and
// loaded by l (closed after it, so that one loader's stages are pinned at
// a time).
func (r *loadRun) warm(l *load.Loader) error {
	cfg := r.cfg
	part, err := measure(r.ctx, loadKindParallel, "warm", cfg.Size, cfg.Samples, nil, func(int) error {
		return parallelRead(cfg.File, cfg.Size, cfg.Readers, cfg.StageSize)
	}, fmt.Sprintf("%d goroutines, %s requests, into Go memory", cfg.Readers, bench.FormatSize(int64(cfg.StageSize))))
	if err != nil {
		return err
	}
	r.add(part)
	pinned, err := pinnedRef(r.ctx, r.gpu, r.dst, cfg.Samples)
	if err != nil {
		return err
	}
	r.add(pinned)
	if part, err = r.loads(l, loadKindLoader, "warm", nil); err != nil {
		return err
	}
	notePinned(part, pinned)
	r.add(part)
	return l.Close(r.ctx)
}

// pinnedRef measures the link's host-to-device rate in this run: one copy
// of up to 256 MiB of pinned host memory into dst on a stream of its own,
// waited for, per sample; the device bytes are checked after the samples.
// It is the reference of the loader's rows (notePinned): a load can at
// best reach it.
func pinnedRef(ctx context.Context, gpu *cuda.Context, dst *cuda.DeviceBuffer, samples int) ([]bench.Result, error) {
	n := min(256<<20, dst.Size())
	host, err := pinmem.Alloc(n, 0, pinmem.WithDevice(gpu.Device()))
	if err != nil {
		return nil, fmt.Errorf("pinned reference: %w", err)
	}
	defer func() { _ = host.Free() }()
	st, err := gpu.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		return nil, err
	}
	defer func() { _ = st.Destroy() }()
	for i := range host.Bytes() {
		host.Bytes()[i] = byte(i*131 + i>>16)
	}
	part, err := measure(ctx, loadKindPinned, "warm", int64(n), samples, nil, func(int) error {
		off := 0
		for _, seg := range host.Segments() { // one copy per registration
			if err := st.CopyHtoD(dst, off, seg); err != nil {
				return err
			}
			off += len(seg)
		}
		return st.Synchronize(ctx)
	}, fmt.Sprintf("%s of pinned host memory to the device, one stream: the link's rate in this run", bench.FormatSize(int64(n))))
	if err != nil || len(part) == 0 || part[0].Skipped {
		return part[:min(len(part), 1)], err
	}
	back := make([]byte, n)
	if _, err := dst.ReadAt(back, 0); err != nil {
		return nil, err
	}
	part[0].Verified = bytes.Equal(back, host.Bytes())
	if !part[0].Verified {
		part[0].VerifyFailed, part[0].Note = true, "VERIFY FAILED: the device bytes differ from the pinned buffer's"
	}
	return part[:1], nil // the GB/s row; the CPU time of a DMA says nothing
}

// notePinned adds to the loader's GB/s row its ratio to the pinned
// reference of the same run.
func notePinned(part, pinned []bench.Result) {
	if len(part) == 0 || len(pinned) == 0 {
		return
	}
	if x, ok := bench.Ratio(part[0], pinned[0]); ok {
		part[0].Note += fmt.Sprintf("; %.2f of %s in this run", x, loadKindPinned)
	}
}

// cold measures the cold file, the page cache dropped before each sample:
// the loader, O_DIRECT reads and buffered reads; without --drop-caches
// their rows are skipped.
func (r *loadRun) cold() error {
	cfg := r.cfg
	if !cfg.DropCaches {
		for _, k := range []string{loadKindLoader, loadKindDirect, loadKindBuffered} {
			for _, u := range []bench.Unit{bench.GBps, bench.CPUsPerGB} {
				r.add([]bench.Result{{Bench: "load", Kind: k, Dir: "cold", Size: cfg.Size, Unit: u, Timing: bench.TimingWall, Skipped: true, Note: "needs --drop-caches, as root"}})
			}
		}
		return nil
	}
	l, err := r.loader(load.WithMode(load.ModeAuto))
	if err != nil {
		return err
	}
	defer func() { _ = l.Close(r.ctx) }()
	part, err := r.loads(l, loadKindLoader, "cold", dropCaches)
	if err != nil {
		return err
	}
	r.add(part)
	reads := []struct {
		kind string
		fn   func(int) error
		note string
	}{
		{loadKindDirect, func(int) error { return directRead(cfg.File, cfg.Size, cfg.Depth, cfg.StageSize) },
			fmt.Sprintf("O_DIRECT, %d requests of %s in flight", cfg.Depth, bench.FormatSize(int64(cfg.StageSize)))},
		{loadKindBuffered, func(int) error { return bufferedRead(cfg.File, cfg.StageSize) },
			fmt.Sprintf("one request of %s at a time", bench.FormatSize(int64(cfg.StageSize)))},
	}
	for _, k := range reads {
		part, err := measure(r.ctx, k.kind, "cold", cfg.Size, cfg.Samples, dropCaches, k.fn, k.note)
		if err != nil {
			return err
		}
		r.add(part)
	}
	return nil
}

// loads measures l loading the file into the device memory, cleared
// first, with before (when not nil) ahead of each sample: rows of kind,
// the device data verified after the samples.
func (r *loadRun) loads(l *load.Loader, kind, dir string, before func() error) ([]bench.Result, error) {
	if err := r.dst.Memset(0); err != nil {
		return nil, err
	}
	var last load.Stats
	part, err := measure(r.ctx, kind, dir, r.cfg.Size, r.cfg.Samples, before, func(int) error {
		st, err := l.LoadFile(r.ctx, r.cfg.File, r.dst)
		last = st
		return err
	}, "")
	if err != nil || len(part) == 0 || part[0].Skipped || part[0].Failed() {
		return part, err
	}
	verr := checkDevice(r.dst, r.cfg.Size, r.crcs)
	for i := range part {
		if verr != nil {
			part[i].VerifyFailed, part[i].Note = true, "VERIFY FAILED: "+verr.Error()
		} else {
			part[i].Verified, part[i].Note = true, loadNote(last, r.cfg)
		}
	}
	return part, nil
}

// settingsNote says the loader's sizes, and whether they were its
// defaults on this machine.
func settingsNote(cfg loadBenchConfig) string {
	n := fmt.Sprintf("%d readers, %d stages of %s, %d streams", cfg.Readers, cfg.Stages, bench.FormatSize(int64(cfg.StageSize)), cfg.Streams)
	if cfg.Defaults {
		n += fmt.Sprintf(" (the loader's defaults on %d cores)", runtime.NumCPU())
	}
	return n
}

// loadNote says how the last load read the file: its mode, how much of
// the file was resident, and why it fell back, if it did; and the
// loader's sizes.
func loadNote(last load.Stats, cfg loadBenchConfig) string {
	n := fmt.Sprintf("mode %s, %s", last.Mode, settingsNote(cfg))
	if last.Resident >= 0 {
		n += fmt.Sprintf(", %.0f%% resident", 100*last.Resident)
	}
	if last.Fallback != "" {
		n += ", fell back: " + last.Fallback
	}
	return n
}
