package safetensors

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/load"
)

// checkpoint is a sharded checkpoint written by writeCheckpoint.
type checkpoint struct {
	dir, index string
	specs      map[string]Spec // by tensor name
	seed       map[string]int  // the generator of each tensor's bytes
	shard      map[string]string
}

// writeCheckpoint writes modelSpecs(total, hidden) as n shards and an
// index under a new directory, the tensors split into n runs.
func writeCheckpoint(t testing.TB, n int, total, hidden int64) checkpoint {
	t.Helper()
	specs := modelSpecs(total, hidden)
	ck := checkpoint{dir: t.TempDir(), specs: map[string]Spec{}, seed: map[string]int{}, shard: map[string]string{}}
	ck.index = filepath.Join(ck.dir, indexName)
	per := (len(specs) + n - 1) / n
	for k := range n {
		part := specs[min(k*per, len(specs)):min((k+1)*per, len(specs))]
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, n)
		f, err := os.Create(filepath.Join(ck.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		w := bufio.NewWriterSize(f, 4<<20)
		_, err = Write(w, part, nil)
		if err == nil {
			err = w.Flush()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range part {
			ck.shard[s.Name] = name
		}
	}
	for i, s := range specs {
		ck.specs[s.Name], ck.seed[s.Name] = s, i
	}
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": ck.shard})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ck.index, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return ck
}

// names returns the shards' names, sorted.
func (ck checkpoint) names() []string {
	var ns []string
	for _, s := range ck.shard {
		ns = append(ns, s)
	}
	slices.Sort(ns)
	return slices.Compact(ns)
}

// buffers allocates a device buffer for every tensor of ck with a byte,
// freed at the end of the test.
func (e fakeEnv) buffers(t *testing.T, ck checkpoint) map[string]*cuda.DeviceBuffer {
	t.Helper()
	bufs := map[string]*cuda.DeviceBuffer{}
	for name, s := range ck.specs {
		_, n, _ := byteLen(s.Shape, s.DType)
		if n == 0 {
			continue
		}
		b, err := e.ctx.Alloc(int(n))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := b.Free(); err != nil {
				t.Error(err)
			}
		})
		bufs[name] = b
	}
	return bufs
}

// TestFakeCheckpoint loads a sharded checkpoint (64 MiB, 64 times the
// stages' bytes so every stage is reused many times; a few MiB with
// -short; PINMEM_CHECKPOINT_MIB sets another size, e.g. 1024 for the 1 GiB
// the GPU suite loads) by its index, by its directory and as a directory
// without index, by every read path, and checks every tensor's bytes, that each
// tensor is announced once, when its bytes are on the device, and that
// the pinned memory stayed within the budget while the shards loaded in
// parallel.
func TestFakeCheckpoint(t *testing.T) {
	total, hidden := int64(64<<20), int64(1024)
	if testing.Short() {
		total, hidden = 6<<20, 256
	}
	if v := os.Getenv("PINMEM_CHECKPOINT_MIB"); v != "" {
		mib, err := strconv.Atoi(v)
		if err != nil || mib < 1 {
			t.Fatalf("PINMEM_CHECKPOINT_MIB=%q: want a positive number of MiB", v)
		}
		total = int64(mib) << 20
	}
	e := newFakeEnv(t)
	ck := writeCheckpoint(t, 4, total, hidden)
	bufs := e.buffers(t, ck)
	noIndex := t.TempDir()
	for _, name := range ck.names() {
		if err := os.Link(filepath.Join(ck.dir, name), filepath.Join(noIndex, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []load.Mode{load.ModeBuffered, load.ModeDirect} {
		l, err := load.New(e.ctx, load.WithStageSize(1<<20), load.WithParallelism(4), load.WithDepth(8), load.WithMode(mode))
		if err != nil {
			t.Fatal(err)
		}
		limit := int64(8 << 20) // the stages: depth 8 of 1 MiB
		paths := []string{ck.index, ck.dir, noIndex}
		if !testing.Short() && mode != load.ModeBuffered {
			paths = paths[:1] // each path once, every way of naming the checkpoint once
		}
		for _, path := range paths {
			t.Run(fmt.Sprintf("%v/%s", mode, filepath.Base(path)), func(t *testing.T) {
				for _, b := range bufs {
					if err := b.Memset(0); err != nil {
						t.Fatal(err)
					}
				}
				pinned0 := pinmem.Stats().Pinned.Bytes
				var peak int64
				seen := map[string]int{}
				var order []string
				st, err := LoadCheckpoint(context.Background(), l, path, Whole(Into(bufs)), func(tn Tensor) {
					peak = max(peak, pinmem.Stats().Pinned.Bytes-pinned0)
					seen[tn.Name]++
					order = append(order, tn.Name)
					b := bufs[tn.Name]
					if got := e.bytes(t, b); !slices.Equal(got, tensorData(ck.seed[tn.Name], tn.Size())) {
						t.Errorf("tensor %s announced before its bytes were on the device", tn.Name)
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				var want int64
				for _, b := range bufs {
					want += int64(b.Size())
				}
				if st.Bytes != want || (mode != load.ModeDirect && st.Mode != mode) {
					t.Errorf("stats %+v", st)
				}
				for name := range bufs {
					if seen[name] != 1 {
						t.Errorf("tensor %s announced %d times", name, seen[name])
					}
					testutil.CheckBytes(t, tensorData(ck.seed[name], int64(bufs[name].Size())), e.bytes(t, bufs[name]))
				}
				if len(order) != len(bufs) {
					t.Errorf("%d tensors announced, %d loaded", len(order), len(bufs))
				}
				if peak > limit {
					t.Errorf("pinned %d bytes while loading, over the budget of %d", peak, limit)
				}
			})
		}
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFakeCheckpointRankSlice loads one rank's rows of every 2-D weight
// (rank 1 of 4 along dimension 0) and nothing else.
func TestFakeCheckpointRankSlice(t *testing.T) {
	e := newFakeEnv(t)
	ck := writeCheckpoint(t, 3, 4<<20, 256)
	const rank, ranks = 1, 4
	bufs := map[string]*cuda.DeviceBuffer{}
	want := map[string][]byte{}
	part := func(tn Tensor) (load.Range, error) {
		if len(tn.Shape) != 2 || tn.Shape[0] == 0 || tn.Shape[0]%ranks != 0 {
			return load.Range{}, nil
		}
		rowBytes := tn.Size() / tn.Shape[0]
		n := rowBytes * tn.Shape[0] / ranks
		b, err := e.ctx.Alloc(int(n))
		if err != nil {
			return load.Range{}, err
		}
		bufs[tn.Name] = b
		want[tn.Name] = tensorData(ck.seed[tn.Name], tn.Size())[rank*n : (rank+1)*n]
		return load.Range{Offset: rank * n, Length: n, Dst: b}, nil
	}
	defer func() {
		for _, b := range bufs {
			if err := b.Free(); err != nil {
				t.Error(err)
			}
		}
	}()
	var ready []string
	st, err := LoadCheckpoint(context.Background(), e.l, ck.index, part, func(tn Tensor) { ready = append(ready, tn.Name) })
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for name, w := range want {
		testutil.CheckBytes(t, w, e.bytes(t, bufs[name]))
		sum += int64(len(w))
	}
	if len(want) < 3 || st.Bytes != sum || len(ready) != len(want) {
		t.Errorf("%d slices, %d bytes, %d announced; stats %+v", len(want), sum, len(ready), st)
	}
}

// TestFakeCheckpointBadInput: each malformed checkpoint is a typed error
// before anything is read, and nothing stays allocated or pinned.
func TestFakeCheckpointBadInput(t *testing.T) {
	e := newFakeEnv(t)
	ck := writeCheckpoint(t, 3, 1<<20, 128)
	names := ck.names()
	index := func(t *testing.T, body string) string {
		dir := t.TempDir() // the shards, linked, beside the bad index
		var p string
		for _, n := range names {
			if err := os.Link(filepath.Join(ck.dir, n), filepath.Join(dir, n)); err != nil {
				t.Fatal(err)
			}
		}
		p = filepath.Join(dir, indexName)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	wm := func(extra string) string {
		b, _ := json.Marshal(ck.shard)
		return `{"weight_map": {` + extra + string(b[1:]) + `}`
	}
	firstOf := func(shard string) string {
		for n, s := range ck.shard {
			if s == shard {
				return n
			}
		}
		return ""
	}
	cases := []struct {
		name string
		path func(t *testing.T) string
		part func(Tensor) (load.Range, error)
		want error
	}{
		{"missing shard", func(t *testing.T) string {
			p := index(t, wm(""))
			if err := os.Remove(filepath.Join(filepath.Dir(p), names[1])); err != nil {
				t.Fatal(err)
			}
			return p
		}, nil, fs.ErrNotExist},
		{"tensor named twice", func(t *testing.T) string {
			return index(t, wm(fmt.Sprintf("%q: %q, ", firstOf(names[0]), names[1])))
		}, nil, ErrFormat},
		{"shard outside the directory", func(t *testing.T) string {
			return index(t, wm(`"evil": "../model.safetensors", `))
		}, nil, ErrFormat},
		{"absolute shard", func(t *testing.T) string {
			return index(t, wm(fmt.Sprintf(`"evil": %q, `, filepath.Join(ck.dir, names[0]))))
		}, nil, ErrFormat},
		{"tensor in another shard than the index says", func(t *testing.T) string {
			m := map[string]string{}
			for k, v := range ck.shard {
				m[k] = v
			}
			m[firstOf(names[0])] = names[1]
			b, _ := json.Marshal(map[string]any{"weight_map": m})
			return index(t, string(b))
		}, nil, ErrFormat},
		{"tensor of the index in no shard", func(t *testing.T) string {
			return index(t, wm(fmt.Sprintf(`"ghost": %q, `, names[0])))
		}, nil, ErrFormat},
		{"tensor in two shards", func(t *testing.T) string {
			dir := t.TempDir()
			for _, n := range []string{names[0], "copy.safetensors"} {
				if err := os.Link(filepath.Join(ck.dir, names[0]), filepath.Join(dir, n)); err != nil {
					t.Fatal(err)
				}
			}
			return dir
		}, nil, ErrFormat},
		{"part out of bounds", func(t *testing.T) string { return ck.index }, func(tn Tensor) (load.Range, error) {
			return load.Range{Offset: 1, Length: tn.Size()}, nil
		}, ErrInvalid},
		{"index not JSON", func(t *testing.T) string { return index(t, `{"weight_map": {`) }, nil, ErrFormat},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			part := c.part
			if part == nil {
				part = func(Tensor) (load.Range, error) { return load.Range{}, nil }
			}
			st, err := LoadCheckpoint(context.Background(), e.l, c.path(t), part, nil)
			if !errors.Is(err, c.want) || st.ReadBytes != 0 {
				t.Errorf("error %v (stats %+v), want %v before any read", err, st, c.want)
			}
		})
	}
}

// TestFakeCheckpointChanges: a shard modified while the checkpoint loads
// is an error matching load.ErrChanged, and nothing stays pinned.
func TestFakeCheckpointChanges(t *testing.T) {
	e := newFakeEnv(t)
	ck := writeCheckpoint(t, 2, 2<<20, 256)
	bufs := e.buffers(t, ck)
	var once sync.Once
	_, err := LoadCheckpoint(context.Background(), e.l, ck.index, Whole(Into(bufs)), func(tn Tensor) {
		once.Do(func() {
			p := filepath.Join(ck.dir, ck.shard[tn.Name])
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte("changed"), 100); err != nil {
				t.Error(err)
			}
			// The clock that stamps writes is coarse: make the change show.
			later := time.Now().Add(time.Second)
			if err := os.Chtimes(p, later, later); err != nil {
				t.Error(err)
			}
		})
	})
	if !errors.Is(err, load.ErrChanged) {
		t.Errorf("error %v, want load.ErrChanged", err)
	}
}

// TestFakeChangedBeforeRead: a shard modified after its header was parsed
// but before the load opened it to read (while part or dst runs, or while
// the load waits for its turn) is an error matching load.ErrChanged too:
// the data would be read with the offsets of another version's header.
func TestFakeChangedBeforeRead(t *testing.T) {
	e := newFakeEnv(t)
	ck := writeCheckpoint(t, 2, 2<<20, 256)
	bufs := e.buffers(t, ck)
	change := func(shard string) {
		p := filepath.Join(ck.dir, shard)
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("changed"), fi.Size()-7); err != nil { // in the data
			t.Fatal(err)
		}
		// The clock that stamps writes is coarse: make the change show.
		later := fi.ModTime().Add(time.Second)
		if err := os.Chtimes(p, later, later); err != nil {
			t.Fatal(err)
		}
	}
	var once sync.Once
	_, err := LoadCheckpoint(context.Background(), e.l, ck.index, func(tn Tensor) (load.Range, error) {
		once.Do(func() { change(ck.shard[tn.Name]) })
		return Whole(Into(bufs))(tn)
	}, nil)
	if !errors.Is(err, load.ErrChanged) {
		t.Errorf("LoadCheckpoint of a shard changed before its read: %v, want load.ErrChanged", err)
	}
	shard := ck.names()[0]
	once = sync.Once{}
	_, _, err = Load(context.Background(), e.l, filepath.Join(ck.dir, shard), func(tn Tensor) (*cuda.DeviceBuffer, error) {
		once.Do(func() { change(shard) })
		return bufs[tn.Name], nil
	})
	if !errors.Is(err, load.ErrChanged) {
		t.Errorf("Load of a file changed before its read: %v, want load.ErrChanged", err)
	}
}
