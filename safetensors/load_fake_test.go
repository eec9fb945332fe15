package safetensors

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/load"
)

type fakeEnv struct {
	d   *fakedrv.Driver
	ctx *cuda.Context
	l   *load.Loader
}

// newFakeEnv installs a fake driver (testutil.UseFake, which fails the
// test if it ends holding driver objects) with a Loader of small stages,
// closed at the end of the test.
func newFakeEnv(t *testing.T) fakeEnv {
	t.Helper()
	d := testutil.UseFake(t, fakedrv.Options{})
	ctx := testutil.PrimaryContext(t)
	l, err := load.New(ctx, load.WithStageSize(64<<10), load.WithParallelism(3), load.WithDepth(5))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return fakeEnv{d, ctx, l}
}

func (e fakeEnv) bytes(t *testing.T, b *cuda.DeviceBuffer) []byte {
	t.Helper()
	m, err := e.d.DeviceBytes(cudadrv.DevicePtr(b.Ptr()), uint64(b.Size()))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestFakeLoadAll(t *testing.T) {
	e := newFakeEnv(t)
	path, h, seed := writeModel(t, t.TempDir(), 2<<20, 256)
	ts, err := LoadAll(context.Background(), e.l, path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ts.Free(); err != nil {
			t.Error(err)
		}
	}()
	if len(ts.Header.Tensors) != len(h.Tensors) || ts.Header.Metadata["format"] != "pt" {
		t.Fatalf("header %d tensors, metadata %v", len(ts.Header.Tensors), ts.Header.Metadata)
	}
	if ts.Stats.Bytes != h.DataEnd-h.DataStart || ts.Buffer.Size() != int(h.DataEnd-h.DataStart) {
		t.Errorf("stats %+v, buffer %d bytes, data region %d", ts.Stats, ts.Buffer.Size(), h.DataEnd-h.DataStart)
	}
	for _, want := range h.Tensors {
		got, view, ok := ts.Tensor(want.Name)
		if !ok || got.DType != want.DType || len(got.Shape) != len(want.Shape) {
			t.Fatalf("tensor %q: %+v, %v", want.Name, got, ok)
		}
		if want.Size() == 0 {
			if view != nil {
				t.Errorf("empty tensor %q has a view", want.Name)
			}
			continue
		}
		testutil.CheckBytes(t, tensorData(seed[want.Name], want.Size()), e.bytes(t, view))
	}
	if _, _, ok := ts.Tensor("missing"); ok {
		t.Error("Tensor(missing) found")
	}
}

// TestFakeLoadChosenBuffers loads each tensor into its own allocation,
// leaves some out, and checks every loaded byte.
func TestFakeLoadChosenBuffers(t *testing.T) {
	e := newFakeEnv(t)
	path, _, seed := writeModel(t, t.TempDir(), 1<<20, 128)
	bufs := map[string]*cuda.DeviceBuffer{}
	defer func() {
		for _, b := range bufs {
			if err := b.Free(); err != nil {
				t.Error(err)
			}
		}
	}()
	h, st, err := Load(context.Background(), e.l, path, func(tn Tensor) (*cuda.DeviceBuffer, error) {
		if tn.Size() == 0 || tn.DType == BF16 { // leave the norms out
			return nil, nil
		}
		b, err := e.ctx.Alloc(int(tn.Size()))
		if err == nil {
			bufs[tn.Name] = b
		}
		return b, err
	})
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	for _, tn := range h.Tensors {
		b, ok := bufs[tn.Name]
		if tn.Size() == 0 || tn.DType == BF16 {
			if ok {
				t.Errorf("tensor %q was allocated", tn.Name)
			}
			continue
		}
		want += tn.Size()
		testutil.CheckBytes(t, tensorData(seed[tn.Name], tn.Size()), e.bytes(t, b))
	}
	if st.Bytes != want {
		t.Errorf("loaded %d bytes, want %d", st.Bytes, want)
	}
}

// TestFakeLoadRefusesBadFiles checks that malformed, truncated and
// oversized files, and bad destinations, are typed errors and leave
// nothing allocated.
func TestFakeLoadRefusesBadFiles(t *testing.T) {
	e := newFakeEnv(t)
	dir := t.TempDir()
	path, h, _ := writeModel(t, dir, 256<<10, 64)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bad := map[string]string{
		"truncated":    write("trunc", good[:len(good)-1]),
		"trailing":     write("trailing", append(append([]byte{}, good...), 0)),
		"short header": write("short", good[:5]),
		"no header":    write("cut", good[:h.DataStart-3]),
		"garbage":      write("garbage", []byte("\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")),
		"empty":        write("empty", nil),
	}
	for name, p := range bad {
		if ts, err := LoadAll(context.Background(), e.l, p); !errors.Is(err, ErrFormat) || ts != nil {
			t.Errorf("LoadAll %s: %v, %v; want ErrFormat", name, ts, err)
		}
		called := false
		if _, _, err := Load(context.Background(), e.l, p, func(Tensor) (*cuda.DeviceBuffer, error) { called = true; return nil, nil }); !errors.Is(err, ErrFormat) || called {
			t.Errorf("Load %s: %v (destination called: %v); want ErrFormat", name, err, called)
		}
	}
	if _, err := LoadAll(context.Background(), e.l, filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	small, err := e.ctx.Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Free()
	_, _, err = Load(context.Background(), e.l, path, func(tn Tensor) (*cuda.DeviceBuffer, error) {
		if tn.Size() > 16 {
			return small, nil
		}
		return nil, nil
	})
	if !errors.Is(err, load.ErrRange) {
		t.Errorf("destination too small: %v", err)
	}
	boom := errors.New("boom")
	if _, _, err := Load(context.Background(), e.l, path, func(Tensor) (*cuda.DeviceBuffer, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Errorf("destination error: %v", err)
	}
	if _, _, err := Load(context.Background(), nil, path, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil loader: %v", err)
	}
	if _, err := LoadAll(context.Background(), nil, path); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil loader: %v", err)
	}
	// A canceled load frees the allocation it made.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := LoadAll(ctx, e.l, path); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled LoadAll: %v", err)
	}
	// A device that cannot hold the data region.
	if err := e.d.FailOn("cuMemAlloc_v2", 1, cudadrv.ErrorOutOfMemory); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadAll(context.Background(), e.l, path); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("allocation failing: %v", err)
	}
}

func TestFakeLoadAllEmpty(t *testing.T) {
	e := newFakeEnv(t)
	p := filepath.Join(t.TempDir(), "empty.safetensors")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Write(f, []Spec{{Name: "nothing", DType: F32, Shape: []int64{0}}}, nil); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ts, err := LoadAll(context.Background(), e.l, p)
	if err != nil || ts.Buffer != nil || len(ts.Header.Tensors) != 1 {
		t.Fatalf("%+v, %v", ts, err)
	}
	if err := ts.Free(); err != nil {
		t.Error(err)
	}
}

// TestFakeLoadInto loads two tensors named in a map, one of them into a
// view of a larger buffer, and nothing else.
func TestFakeLoadInto(t *testing.T) {
	e := newFakeEnv(t)
	path, h, seed := writeModel(t, t.TempDir(), 512<<10, 64)
	a, _ := h.Lookup("layers.0.weight")
	b, _ := h.Lookup("embed.ids")
	big, err := e.ctx.Alloc(int(a.Size()+b.Size()) + 512)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Free()
	va, _ := big.Slice(0, int(a.Size()))
	vb, _ := big.Slice(int(a.Size())+512, int(b.Size()))
	_, st, err := Load(context.Background(), e.l, path, Into(map[string]*cuda.DeviceBuffer{a.Name: va, b.Name: vb, "not in the file": big}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Bytes != a.Size()+b.Size() {
		t.Errorf("loaded %d bytes, want %d", st.Bytes, a.Size()+b.Size())
	}
	testutil.CheckBytes(t, tensorData(seed[a.Name], a.Size()), e.bytes(t, va))
	testutil.CheckBytes(t, tensorData(seed[b.Name], b.Size()), e.bytes(t, vb))
}

// TestFakeTensorAfterFree: once the buffer is freed, Tensor still reports
// the file's tensors (the header is unchanged) but hands out no view of
// the freed memory.
func TestFakeTensorAfterFree(t *testing.T) {
	e := newFakeEnv(t)
	path, h, _ := writeModel(t, t.TempDir(), 64<<10, 64)
	ts, err := LoadAll(context.Background(), e.l, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.Free(); err != nil {
		t.Fatal(err)
	}
	for _, want := range h.Tensors {
		got, view, ok := ts.Tensor(want.Name)
		if !ok || got.Name != want.Name || view != nil {
			t.Errorf("after Free, Tensor(%q) = %+v, %v, %v; want the tensor, no view, true", want.Name, got, view, ok)
		}
	}
}

// TestFakeLoadWhileReplaced loads a path whose symbolic link another
// goroutine keeps switching between two files of the same layout, one
// holding tensor "a" and the other tensor "b": every load that succeeds
// must deliver the data of the file whose header it returned.
func TestFakeLoadWhileReplaced(t *testing.T) {
	e := newFakeEnv(t)
	dir := t.TempDir()
	const n = 96 << 10
	files := map[string]string{}
	datas := map[string][]byte{}
	for i, name := range []string{"a", "b"} {
		write, want := randomData(n, uint64(40+i))
		p := filepath.Join(dir, name+".safetensors")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Write(f, []Spec{{Name: name, DType: U8, Shape: []int64{n}, Data: write}}, nil); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		files[name], datas[name] = p, want
	}
	link := filepath.Join(dir, "current.safetensors")
	defer testutil.FlipSymlink(t, link, files["a"], files["b"])()
	for i := range 200 {
		ts, err := LoadAll(context.Background(), e.l, link)
		if err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
		name := ts.Header.Tensors[0].Name
		_, view, _ := ts.Tensor(name)
		got := e.bytes(t, view)
		if err := ts.Free(); err != nil {
			t.Fatal(err)
		}
		if off := testutil.FirstMismatch(datas[name], got); off >= 0 {
			t.Fatalf("load %d: the header names tensor %q, the data differs from its file's at %d", i, name, off)
		}
	}
}

// TestFakeLoadAllCanceled: LoadAll whose context ends while its copies are
// queued on a device that does not run them returns the context's error
// and frees its allocation only once those copies ran: they never write
// to freed memory (the fake driver faults such a copy, and the fault
// would break the context), and the Loader loads again afterwards.
func TestFakeLoadAllCanceled(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{WaitTimeout: -1})
	ctx := testutil.PrimaryContext(t)
	l, err := load.New(ctx, load.WithStageSize(64<<10), load.WithParallelism(3), load.WithDepth(5))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	e := fakeEnv{d, ctx, l}
	path, h, seed := writeModel(t, t.TempDir(), 1<<20, 256)
	d.Pause()
	done := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		ts, err := LoadAll(cctx, l, path)
		if err == nil {
			err = errors.Join(errors.New("LoadAll succeeded on a paused device"), ts.Free())
		}
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		d.Resume()
		t.Fatal("LoadAll still blocked 10 s after its deadline")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("LoadAll on a paused device: %v, want the deadline", err)
	}
	d.Resume()
	ts, err := LoadAll(context.Background(), l, path)
	if err != nil {
		t.Fatalf("LoadAll after the device resumed: %v", err)
	}
	for _, want := range h.Tensors {
		if _, view, _ := ts.Tensor(want.Name); view != nil {
			testutil.CheckBytes(t, tensorData(seed[want.Name], want.Size()), e.bytes(t, view))
		}
	}
	if err := errors.Join(ts.Free(), l.Close(context.Background())); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); d.Live().DeviceAllocs != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the canceled LoadAll's allocation is still live: %+v", d.Live())
		}
	}
}
