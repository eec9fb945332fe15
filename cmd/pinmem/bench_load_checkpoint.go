package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/load"
	"github.com/pinmem/pinmem/safetensors"
)

// Kinds of the checkpoint rows of the load bench.
const (
	loadKindCheckpoint = "checkpoint"       // safetensors.LoadCheckpoint of every tensor
	loadKindFirst      = "checkpoint-first" // ms from the call to the first tensor on the device
)

// isCheckpoint reports whether the load bench's argument names a sharded
// checkpoint (a directory or an index) rather than one file.
func isCheckpoint(path string, fi os.FileInfo) bool {
	return fi.IsDir() || strings.HasSuffix(path, ".index.json")
}

// checkpointShards returns the .safetensors files of the checkpoint at
// path: the shards its index names, or the directory's .safetensors files.
// (LoadCheckpoint itself checks all of it strictly; this is for the
// reference read and the verification.)
func checkpointShards(path string) ([]string, error) {
	index := path
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		index = filepath.Join(path, "model.safetensors.index.json")
		if _, err := os.Stat(index); err != nil {
			return filepath.Glob(filepath.Join(path, "*.safetensors"))
		}
	}
	b, err := os.ReadFile(index)
	if err != nil {
		return nil, err
	}
	var ix struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &ix); err != nil {
		return nil, fmt.Errorf("%s: %w", index, err)
	}
	var shards []string
	for _, s := range ix.WeightMap {
		shards = append(shards, filepath.Join(filepath.Dir(index), s))
	}
	slices.Sort(shards)
	return slices.Compact(shards), nil
}

// placedTensor is a tensor of a checkpoint, its shard and its place in
// the bench's one device allocation.
type placedTensor struct {
	t     safetensors.Tensor
	shard string
	off   int64
}

// runCheckpointBench measures safetensors.LoadCheckpoint of the checkpoint
// at cfg.File into one device allocation (every tensor, packed), with the
// Loader's mode and with ModeMapped, beside a parallel read of every shard
// from the page cache; and the time until the first tensor is on the
// device. It sets cfg.Size to the tensors' bytes.
func runCheckpointBench(ctx context.Context, gpu *cuda.Context, cfg *loadBenchConfig, opts []load.Option, progress io.Writer) ([]bench.Result, error) {
	shards, err := checkpointShards(cfg.File)
	if err != nil {
		return nil, err
	}
	r := &checkpointRun{rowLog: rowLog{progress: progress}, ctx: ctx, gpu: gpu, cfg: cfg, opts: opts, shards: shards, byName: map[string]int{}}
	if err := r.place(); err != nil {
		return nil, err
	}
	if cfg.Size == 0 {
		return nil, fmt.Errorf("%s: no tensor bytes", cfg.File)
	}
	r.dst, err = gpu.Alloc(int(cfg.Size))
	if err != nil {
		return nil, fmt.Errorf("allocating %d bytes of device memory: %w", cfg.Size, err)
	}
	defer func() { _ = r.dst.Free() }()
	part, err := measure(ctx, loadKindParallel, "warm", r.fileBytes, cfg.Samples, nil, func(int) error {
		for _, s := range shards {
			if err := parallelRead(s, fileSize(s), cfg.Readers, cfg.StageSize); err != nil {
				return err
			}
		}
		return nil
	}, fmt.Sprintf("%d shards, one after the other, %d goroutines each, into Go memory", len(shards), cfg.Readers))
	if err != nil {
		return r.rs, err
	}
	r.add(part)
	pinned, err := pinnedRef(ctx, gpu, r.dst, cfg.Samples)
	if err != nil {
		return r.rs, err
	}
	r.add(pinned)
	if part, err = r.loads(loadKindCheckpoint, "warm", nil); err != nil {
		return r.rs, err
	}
	notePinned(part, pinned)
	r.add(part)
	if cfg.DropCaches {
		return r.rs, r.cold()
	}
	return r.rs, nil
}

// cold measures the checkpoint with the page cache dropped before every
// sample: the disk's parallel reads of every shard at once (O_DIRECT with
// --depth requests in flight per shard, and buffered with --readers
// goroutines per shard), then LoadCheckpoint (ModeAuto), whose note gives
// its ratio to the better of the two reads, the disk's best parallel read
// in this run.
func (r *checkpointRun) cold() error {
	cfg := r.cfg
	eachShard := func(read func(path string) error) func(int) error {
		return func(int) error {
			errs := make([]error, len(r.shards))
			var wg sync.WaitGroup
			for i, s := range r.shards {
				wg.Go(func() { errs[i] = read(s) })
			}
			wg.Wait()
			return errors.Join(errs...)
		}
	}
	var best bench.Result
	for _, k := range []struct {
		kind string
		read func(path string) error
		note string
	}{
		{loadKindDirect, func(s string) error { return directRead(s, fileSize(s), cfg.Depth, cfg.StageSize) },
			fmt.Sprintf("%d shards at once, O_DIRECT, %d requests of %s in flight each", len(r.shards), cfg.Depth, bench.FormatSize(int64(cfg.StageSize)))},
		{loadKindParallel, func(s string) error { return parallelRead(s, fileSize(s), cfg.Readers, cfg.StageSize) },
			fmt.Sprintf("%d shards at once, %d goroutines each, %s requests, into Go memory", len(r.shards), cfg.Readers, bench.FormatSize(int64(cfg.StageSize)))},
	} {
		part, err := measure(r.ctx, k.kind, "cold", r.fileBytes, cfg.Samples, dropCaches, eachShard(k.read), k.note)
		if err != nil {
			return err
		}
		r.add(part)
		if len(part) > 0 && !part[0].Skipped && part[0].Median > best.Median {
			best = part[0]
		}
	}
	part, err := r.loads(loadKindCheckpoint, "cold", dropCaches, load.WithMode(load.ModeAuto))
	if err != nil {
		return err
	}
	if x, ok := bench.Ratio(part[0], best); ok {
		part[0].Note += fmt.Sprintf("; %.2f of the disk's best parallel read in this run (%s, %.3g GB/s)", x, best.Kind, best.Median)
	}
	r.add(part)
	return nil
}

// rowLog collects a bench's rows, writing each as a progress line.
type rowLog struct {
	progress io.Writer
	rs       []bench.Result
}

// add appends rows, each also a progress line.
func (l *rowLog) add(part []bench.Result) {
	for _, row := range part {
		l.rs = append(l.rs, row)
		if l.progress != nil {
			fmt.Fprintf(l.progress, "pinmem: %s\n", row)
		}
	}
}

// checkpointRun is one run of the checkpoint bench: every tensor of the
// checkpoint and its place in the one device allocation.
type checkpointRun struct {
	rowLog
	ctx       context.Context
	gpu       *cuda.Context
	cfg       *loadBenchConfig
	opts      []load.Option
	shards    []string
	placed    []placedTensor
	byName    map[string]int // index in placed
	fileBytes int64          // the shards' bytes up to their data's end
	dst       *cuda.DeviceBuffer
}

// place reads every shard's header and packs its tensors one after the
// other; cfg.Size becomes their bytes.
func (r *checkpointRun) place() error {
	for _, s := range r.shards {
		h, err := safetensors.ReadHeader(s)
		if err != nil {
			return err
		}
		r.fileBytes += h.DataEnd
		for _, t := range h.Tensors {
			r.byName[t.Name] = len(r.placed)
			r.placed = append(r.placed, placedTensor{t, s, r.cfg.Size})
			r.cfg.Size += t.Size()
		}
	}
	return nil
}

// part is LoadCheckpoint's part function: each tensor whole, at its place.
func (r *checkpointRun) part(t safetensors.Tensor) (load.Range, error) {
	i, ok := r.byName[t.Name]
	if !ok || t.Size() == 0 {
		return load.Range{}, nil
	}
	v, err := r.dst.Slice(int(r.placed[i].off), int(t.Size()))
	return load.Range{Length: t.Size(), Dst: v}, err
}

// loads measures LoadCheckpoint by a loader of the run's options and then
// mode, into the device memory cleared first, with before (when not nil)
// ahead of each sample: rows of kind and dir, verified, and for the warm
// checkpoint the time to the first tensor.
func (r *checkpointRun) loads(kind, dir string, before func() error, mode ...load.Option) ([]bench.Result, error) {
	ctx, cfg := r.ctx, r.cfg
	l, err := pinnedLoader(ctx, r.gpu, *cfg, r.shards[0], r.dst, append(append([]load.Option{}, r.opts...), mode...)...)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var firsts []float64
	var last load.Stats
	if err := r.dst.Memset(0); err != nil {
		_ = l.Close(ctx)
		return nil, err
	}
	part, err := measure(ctx, kind, dir, cfg.Size, cfg.Samples, before, func(int) error {
		t0, first := time.Now(), time.Duration(0)
		st, err := safetensors.LoadCheckpoint(ctx, l, cfg.File, r.part, func(safetensors.Tensor) {
			mu.Lock()
			if first == 0 {
				first = time.Since(t0)
			}
			mu.Unlock()
		})
		last = st
		mu.Lock() // a ready call may still run once a load's ctx ended
		firsts = append(firsts, float64(first)/float64(time.Millisecond))
		mu.Unlock()
		return err
	}, "")
	if cerr := l.Close(ctx); err == nil {
		err = cerr
	}
	if err != nil || len(part) == 0 || part[0].Skipped {
		return part, err
	}
	r.verify(part, last)
	if dir == "warm" {
		sum := bench.Summarize(firsts)
		whole := 1e3 * float64(cfg.Size) / 1e9 / part[0].Median // ms
		part = append(part, bench.Result{Bench: "load", Kind: loadKindFirst, Dir: "warm", Size: cfg.Size, Unit: bench.Ms,
			Timing: bench.TimingWall, Median: sum.Median, Min: sum.Min, Max: sum.Max, Samples: sum.N,
			Note: fmt.Sprintf("the first tensor on the device; the whole load %.3g ms (median): %.1f%% of it", whole, 100*sum.Median/whole)})
	}
	return part, nil
}

// verify checks every tensor on the device against its shard and says so
// in the rows, with how the last load read the checkpoint.
func (r *checkpointRun) verify(part []bench.Result, last load.Stats) {
	verr := verifyCheckpoint(r.dst, r.placed)
	for i := range part {
		part[i].Verified, part[i].Note = verr == nil, fmt.Sprintf("%d tensors, %d shards, mode %s, %s", len(r.placed), len(r.shards), last.Mode, settingsNote(*r.cfg))
		if last.Fallback != "" {
			part[i].Note += ", fell back: " + last.Fallback
		}
		if verr != nil {
			part[i].VerifyFailed, part[i].Note = true, "VERIFY FAILED: "+verr.Error()
		}
	}
}

// fileSize returns the size of the file at path, 0 if it cannot be read.
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// verifyCheckpoint compares the CRC-32C of every tensor in dst with that
// of its bytes in its shard.
func verifyCheckpoint(dst *cuda.DeviceBuffer, placed []placedTensor) error {
	var buf, dev []byte
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, p := range placed {
		n := int(p.t.Size())
		if n == 0 {
			continue
		}
		f := files[p.shard]
		if f == nil {
			var err error
			if f, err = os.Open(p.shard); err != nil {
				return err
			}
			files[p.shard] = f
		}
		buf, dev = slices.Grow(buf[:0], n)[:n], slices.Grow(dev[:0], n)[:n]
		if _, err := f.ReadAt(buf, p.t.Begin); err != nil {
			return err
		}
		if _, err := dst.ReadAt(dev, int64(int(p.off))); err != nil {
			return err
		}
		if crc32.Checksum(buf, castagnoli) != crc32.Checksum(dev, castagnoli) {
			return &verifyError{fmt.Sprintf("tensor %q of %s differs on the device", p.t.Name, p.shard)}
		}
	}
	return nil
}
