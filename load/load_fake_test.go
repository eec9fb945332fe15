package load

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// fakeEnv is a fake driver with a primary context.
type fakeEnv struct {
	d   *fakedrv.Driver
	ctx *cuda.Context
}

// newFakeEnv installs a fake driver (testutil.UseFake, which fails the
// test if it ends holding driver objects) and retains its primary context.
func newFakeEnv(t *testing.T, opts fakedrv.Options) fakeEnv {
	t.Helper()
	d := testutil.UseFake(t, opts)
	return fakeEnv{d, testutil.PrimaryContext(t)}
}

// loader returns a Loader with small stages, closed at the end of the test.
func (e fakeEnv) loader(t *testing.T, opts ...Option) *Loader {
	t.Helper()
	l, err := New(e.ctx, append([]Option{WithStageSize(64 << 10), WithParallelism(4), WithDepth(6)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

func (e fakeEnv) devbuf(t *testing.T, n int) *cuda.DeviceBuffer {
	t.Helper()
	b, err := e.ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Free(); err != nil {
			t.Errorf("freeing device buffer: %v", err)
		}
	})
	return b
}

func (e fakeEnv) deviceBytes(t *testing.T, b *cuda.DeviceBuffer, n int) []byte {
	t.Helper()
	m, err := e.d.DeviceBytes(cudadrv.DevicePtr(b.Ptr()), uint64(n))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// tempFile writes n random bytes to a new file and returns its path and
// contents.
func tempFile(t *testing.T, n int, seed uint64) (string, []byte) {
	t.Helper()
	data := testutil.RandomBytes(n, seed)
	p := filepath.Join(t.TempDir(), "weights.bin")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, data
}

func TestFakeLoadFileEveryMode(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	for _, n := range []int{1, 4095, 4096, 64<<10 - 1, 64 << 10, 64<<10 + 1, 1<<20 + 12345} {
		path, data := tempFile(t, n, uint64(n))
		for _, m := range []Mode{ModeBuffered, ModeDirect, ModeAuto, ModeMapped} {
			t.Run(fmt.Sprintf("%d/%v", n, m), func(t *testing.T) {
				l := e.loader(t, WithMode(m))
				dst := e.devbuf(t, n+100)
				if err := dst.Memset(0xA5); err != nil {
					t.Fatal(err)
				}
				st, err := l.LoadFile(context.Background(), path, dst)
				if err != nil {
					t.Fatal(err)
				}
				if st.Bytes != int64(n) || st.ReadBytes < int64(n) || st.Reads < 1 || st.Mode == ModeAuto || st.Wall <= 0 {
					t.Errorf("stats %+v", st)
				}
				if m == ModeDirect && st.Mode == ModeBuffered && st.Fallback == "" {
					t.Errorf("direct load read buffered without saying why: %+v", st)
				}
				if m != ModeAuto && st.Resident != -1 {
					t.Errorf("Resident %v without sampling", st.Resident)
				}
				got := e.deviceBytes(t, dst, n+100)
				testutil.CheckBytes(t, data, got[:n])
				for i, b := range got[n:] {
					if b != 0xA5 {
						t.Fatalf("byte %d after the file was written: %#x", n+i, b)
					}
				}
			})
		}
	}
}

// TestFakeLoadRanges loads scattered ranges (overlapping in the file,
// adjacent, empty, unaligned) into views of one allocation and into
// separate ones, and checks every destination byte.
func TestFakeLoadRanges(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 1<<20, 3)
	big := e.devbuf(t, 1<<20)
	view := func(off, n int) *cuda.DeviceBuffer {
		v, err := big.Slice(off, n)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	other := e.devbuf(t, 300000)
	rs := []Range{
		{Offset: 0, Length: 1000, Dst: view(0, 1000)},
		{Offset: 1000, Length: 5000, Dst: view(1000, 5000)},
		{Offset: 500, Length: 700, Dst: view(10000, 700)}, // overlaps range 0 in the file
		{Offset: 777777, Length: 0},
		{Offset: 700001, Length: 300000, Dst: other},
		{Offset: 1<<20 - 3, Length: 3, Dst: view(20000, 3)},
	}
	for _, m := range []Mode{ModeBuffered, ModeDirect} {
		if err := big.Memset(0); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var reports []int64
		l := e.loader(t, WithMode(m), WithProgress(func(done, total int64) {
			mu.Lock()
			defer mu.Unlock()
			if total != 1000+5000+700+300000+3 {
				t.Errorf("progress total %d", total)
			}
			if len(reports) > 0 && done < reports[len(reports)-1] {
				t.Errorf("progress went back from %d to %d", reports[len(reports)-1], done)
			}
			reports = append(reports, done)
		}))
		st, err := l.Load(context.Background(), path, rs)
		if err != nil {
			t.Fatal(err)
		}
		if st.Bytes != 306703 {
			t.Errorf("%v: Bytes %d", m, st.Bytes)
		}
		if len(reports) < 2 || reports[0] != 0 || reports[len(reports)-1] != st.Bytes {
			t.Errorf("%v: progress reports %v", m, reports)
		}
		for i, r := range rs {
			if r.Length == 0 {
				continue
			}
			got := e.deviceBytes(t, r.Dst, int(r.Length))
			if off := testutil.FirstMismatch(data[r.Offset:r.Offset+r.Length], got); off >= 0 {
				t.Errorf("%v: range %d differs at %d", m, i, off)
			}
		}
	}
}

func TestFakeRangeErrors(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, _ := tempFile(t, 10000, 4)
	l := e.loader(t)
	dst := e.devbuf(t, 20000)
	half, err := dst.Slice(0, 5000)
	if err != nil {
		t.Fatal(err)
	}
	freed, err := e.ctx.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	if err := freed.Free(); err != nil {
		t.Fatal(err)
	}
	otherCtx, err := cuda.NewContext(e.ctx.Device(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := otherCtx.Destroy(); err != nil {
			t.Error(err)
		}
	}()
	foreign := cuda.WrapDevicePtr(otherCtx, dst.Ptr(), 100)
	for name, rs := range map[string][]Range{
		"negative offset":  {{Offset: -1, Length: 10, Dst: dst}},
		"negative length":  {{Offset: 0, Length: -10, Dst: dst}},
		"huge":             {{Offset: 1 << 62, Length: 1 << 62, Dst: dst}},
		"nil destination":  {{Offset: 0, Length: 10}},
		"small dst":        {{Offset: 0, Length: 6000, Dst: half}},
		"freed dst":        {{Offset: 0, Length: 10, Dst: freed}},
		"other context":    {{Offset: 0, Length: 10, Dst: foreign}},
		"overlapping dsts": {{Offset: 0, Length: 10, Dst: dst}, {Offset: 100, Length: 10, Dst: half}},
	} {
		_, err := l.Load(context.Background(), path, rs)
		var re *RangeError
		if !errors.Is(err, ErrRange) || !errors.As(err, &re) || !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("%s: %v, want a *RangeError", name, err)
		}
	}
	_, err = l.Load(context.Background(), path, []Range{{Offset: 9000, Length: 1001, Dst: dst}})
	var se *ShortFileError
	if !errors.Is(err, ErrShortFile) || !errors.As(err, &se) || se.Need != 10001 || se.Size != 10000 {
		t.Errorf("range past the end: %v", err)
	}
	if _, err := l.Load(context.Background(), filepath.Join(t.TempDir(), "missing"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := l.LoadFile(context.Background(), path, half); !errors.Is(err, ErrRange) {
		t.Errorf("LoadFile into a small buffer: %v", err)
	}
	st, err := l.Load(context.Background(), path, nil)
	if err != nil || st.Bytes != 0 {
		t.Errorf("empty load: %+v, %v", st, err)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Load(context.Background(), path, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Load after Close: %v", err)
	}
	if err := l.Close(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

func TestFakeOptions(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	for name, opt := range map[string]Option{
		"nil":             nil,
		"stage 0":         WithStageSize(0),
		"stage unaligned": WithStageSize(5000),
		"stage huge":      WithStageSize(2 << 30),
		"parallelism 0":   WithParallelism(0),
		"depth 0":         WithDepth(0),
		"streams 0":       WithStreams(0),
		"mode":            WithMode(Mode(9)),
		"warm":            WithWarmThreshold(1.5),
		"too much":        func(c *config) { c.stageSize, c.depth, c.depthSet = MaxStageSize, 1000, true },
	} {
		l, err := New(e.ctx, opt)
		var oe *pinmem.OptionError
		if !errors.As(err, &oe) || !errors.Is(err, cuda.ErrInvalidValue) || oe.Func != "load.New" || oe.Option == "" {
			t.Errorf("%s: New = %v, %v; want a *pinmem.OptionError of load.New", name, l, err)
		}
		// New checks the options before the context: a command line
		// checks its flags with New(nil, ...).
		if _, err := New(nil, opt); !errors.As(err, &oe) {
			t.Errorf("%s: New(nil) = %v; want the *pinmem.OptionError", name, err)
		}
		if l != nil {
			_ = l.Close(context.Background())
		}
	}
	if _, err := New(nil); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("New(nil): %v", err)
	}
	if _, err := New(nil, WithDepth(2)); !errors.Is(err, cuda.ErrInvalidValue) || errors.As(err, new(*pinmem.OptionError)) {
		t.Errorf("New(nil, valid options) = %v; want the nil context's error, not an *OptionError", err)
	}
	l := e.loader(t, WithDepth(3), WithStageSize(8192))
	if l.PinnedBytes() != 0 {
		t.Errorf("New pinned %d bytes, want 0 (the first load pins the stages)", l.PinnedBytes())
	}
}

// TestFakeNewReleasesOnFailure makes New fail at each of its driver
// calls; testutil.UseFake's cleanup checks nothing is left. (New pins
// nothing: TestFakeFirstLoadPinsUnderBudget covers the budget.)
func TestFakeNewReleasesOnFailure(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	for _, op := range []string{"cuStreamCreate", "cuEventCreate"} {
		for nth := 1; nth <= 3; nth++ {
			if err := e.d.FailOn(op, nth, cudadrv.ErrorOutOfMemory); err != nil {
				t.Fatal(err)
			}
			l, err := New(e.ctx, WithStageSize(64<<10), WithDepth(4), WithStreams(2))
			if err == nil {
				_ = l.Close(context.Background())
				if nth <= 2 || op == "cuEventCreate" {
					t.Errorf("%s failing at call %d: New succeeded", op, nth)
				}
			}
			e.d.ClearFaults()
		}
	}
}

// TestFakeCancel cancels a load from its progress callback, buffered and
// direct: Load returns context.Canceled having delivered part of the
// data (its readers, still reading, stop on their own: run it with -race),
// and everything is released (testutil.UseFake's cleanup).
func TestFakeCancel(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 4<<20, 5)
	for _, m := range []Mode{ModeBuffered, ModeDirect} {
		var cancel context.CancelFunc
		l := e.loader(t, WithMode(m), WithProgress(func(done, _ int64) {
			if done > 0 {
				cancel()
			}
		}))
		dst := e.devbuf(t, 4<<20)
		var ctx context.Context
		for range 10 { // readers caught at different points
			var c context.CancelFunc
			ctx, c = context.WithCancel(context.Background())
			defer c()
			cancel = c
			st, err := l.LoadFile(ctx, path, dst)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("canceled %v load: %+v, %v", m, st, err)
			}
			if st.Bytes == 0 || st.Bytes >= 4<<20 {
				t.Errorf("%v: canceled after the first stage, delivered %d bytes", m, st.Bytes)
			}
		}
		// The Loader is still usable.
		if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
			t.Fatal(err)
		}
		testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
		// A context canceled before the call reads nothing.
		if st, err := l.LoadFile(ctx, path, dst); !errors.Is(err, context.Canceled) || st.ReadBytes != 0 {
			t.Errorf("%v load with a canceled context: %+v, %v", m, st, err)
		}
	}
}

// TestFakeCanceledFirstLoad loads with a canceled context on a Loader that
// never loaded: the error says the load was canceled before it began, not
// that it waited for an earlier load's copies (there were none).
func TestFakeCanceledFirstLoad(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, _ := tempFile(t, 1<<20, 5)
	dst := e.devbuf(t, 1<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 20 { // the waits were selects that could pick ctx.Done() at random
		l := e.loader(t)
		st, err := l.LoadFile(ctx, path, dst)
		if !errors.Is(err, context.Canceled) || st.ReadBytes != 0 {
			t.Fatalf("first load with a canceled context: %+v, %v", st, err)
		}
		if msg := err.Error(); msg != "load: canceled before it began: context canceled" {
			t.Fatalf("first load with a canceled context: %q", msg)
		}
	}
}

// TestFakeFileShrinks truncates the file while it is loaded: the load
// fails with a *ShortFileError.
func TestFakeFileShrinks(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, _ := tempFile(t, 2<<20, 6)
	var once sync.Once
	l := e.loader(t, WithMode(ModeBuffered), WithParallelism(1), WithDepth(1), WithProgress(func(done, _ int64) {
		if done > 0 {
			once.Do(func() {
				if err := os.Truncate(path, 1<<20); err != nil {
					t.Error(err)
				}
			})
		}
	}))
	dst := e.devbuf(t, 2<<20)
	_, err := l.LoadFile(context.Background(), path, dst)
	var se *ShortFileError
	if !errors.Is(err, ErrShortFile) || !errors.As(err, &se) || se.Size != 1<<20 {
		t.Fatalf("load of a file cut to 1 MiB: %v", err)
	}
}

// TestFakeCopyFailures makes a copy fail when it is queued and when it
// runs: both end the load with the driver's error, and nothing leaks.
func TestFakeCopyFailures(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, _ := tempFile(t, 1<<20, 7)
	l := e.loader(t, WithMode(ModeBuffered))
	dst := e.devbuf(t, 1<<20)
	// (Not CUDA_ERROR_INVALID_VALUE: package cuda retries that in the
	// stream's context.)
	if err := e.d.FailOn("cuMemcpyHtoDAsync_v2", 3, cudadrv.ErrorOutOfMemory); err != nil {
		t.Fatal(err)
	}
	if _, err := l.LoadFile(context.Background(), path, dst); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("queued copy failing: %v", err)
	}
	e.d.ClearFaults()
	if err := e.d.FailAsync("cuMemcpyHtoDAsync_v2", 5, cudadrv.ErrorIllegalAddress); err != nil {
		t.Fatal(err)
	}
	if _, err := l.LoadFile(context.Background(), path, dst); err == nil || !strings.Contains(err.Error(), "ILLEGAL_ADDRESS") {
		t.Errorf("copy failing as it runs: %v", err)
	}
	e.d.ClearFaults()
	if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
		t.Errorf("load after the faults: %v", err)
	}
}

// TestFakeDirectRefused simulates a file system that refuses O_DIRECT:
// the load reads buffered and says why.
func TestFakeDirectRefused(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 300000, 8)
	prev := openDirectFile
	openDirectFile = func(*os.File) (*os.File, error) { return nil, errors.New("invalid argument (simulated)") }
	defer func() { openDirectFile = prev }()
	l := e.loader(t, WithMode(ModeDirect))
	dst := e.devbuf(t, len(data))
	st, err := l.LoadFile(context.Background(), path, dst)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != ModeBuffered || !strings.Contains(st.Fallback, "simulated") {
		t.Errorf("stats %+v, want a buffered load that names the refusal", st)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
}

// TestFakeConcurrentLoads runs loads from several goroutines on one
// Loader (they take turns) under the race detector.
func TestFakeConcurrentLoads(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	l := e.loader(t)
	var wg sync.WaitGroup
	for g := range 4 {
		path, data := tempFile(t, 200000+g*1000, uint64(10+g))
		dst := e.devbuf(t, len(data))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
				t.Error(err)
				return
			}
			if off := testutil.FirstMismatch(data, e.deviceBytes(t, dst, len(data))); off >= 0 {
				t.Errorf("goroutine %d: differs at %d", g, off)
			}
		}()
	}
	wg.Wait()
}

// TestFakePinnedMemoryIsBounded checks that a Loader pins nothing in New,
// its stages at the first load and nothing more while it loads (a second
// load pins nothing), and nothing after Close.
func TestFakePinnedMemoryIsBounded(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 3<<20, 11)
	before := pinmem.Stats().Pinned.Bytes
	var peak int64
	l, err := New(e.ctx, WithStageSize(64<<10), WithDepth(5), WithParallelism(3), WithProgress(func(int64, int64) {
		peak = max(peak, pinmem.Stats().Pinned.Bytes)
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got := pinmem.Stats().Pinned.Bytes - before; got != 0 || l.PinnedBytes() != 0 {
		t.Errorf("New pinned %d bytes, PinnedBytes %d, want 0", got, l.PinnedBytes())
	}
	dst := e.devbuf(t, 3<<20)
	for i := range 2 {
		allocs := pinmem.Stats().Allocs
		if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
			t.Fatal(err)
		}
		testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
		if got := pinmem.Stats().Pinned.Bytes - before; got != l.PinnedBytes() || got != 5*64<<10 {
			t.Errorf("load %d: %d bytes pinned, PinnedBytes %d, want 5 x 64 KiB", i+1, got, l.PinnedBytes())
		}
		if peak-before != 5*64<<10 {
			t.Errorf("load %d: pinned %d bytes during the load, want the stages' %d", i+1, peak-before, 5*64<<10)
		}
		if pins, want := pinmem.Stats().Allocs-allocs, int64(5*(1-i)); pins != want {
			t.Errorf("load %d pinned %d buffers, want %d (the first load pins the stages, later ones reuse them)", i+1, pins, want)
		}
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := pinmem.Stats().Pinned.Bytes; got != before {
		t.Errorf("%d bytes pinned after Close, %d before New", got, before)
	}
}

// TestFakeWaitingLoadCanceled: a Load waiting for another load on the same
// Loader to end gives up with its context's error when the context ends,
// instead of waiting for the other load however long it takes.
func TestFakeWaitingLoadCanceled(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 1<<20, 12)
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	// The first load stops in its first progress report after data landed
	// until release is closed.
	l := e.loader(t, WithMode(ModeBuffered), WithProgress(func(done, _ int64) {
		if done > 0 {
			once.Do(func() { close(started); <-release })
		}
	}))
	dst := e.devbuf(t, len(data))
	first := make(chan error, 1)
	go func() {
		_, err := l.LoadFile(context.Background(), path, dst)
		first <- err
	}()
	<-started
	other := e.devbuf(t, len(data))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	second := make(chan error, 1)
	go func() {
		_, err := l.LoadFile(ctx, path, other)
		second <- err
	}()
	select {
	case err := <-second:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("waiting load whose context ended: %v, want context.DeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("a waiting Load did not return 5 s after its context ended")
		close(release)
		<-second
		release = nil
	}
	if release != nil {
		close(release)
	}
	if err := <-first; err != nil {
		t.Errorf("the first load: %v", err)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
}

// TestFakeDirectOpenFindsAnotherFile replaces the file between the load's
// buffered open and its direct open (simulated by the hook, which opens
// another file): the load must read the file it checked the ranges
// against, not whatever the path names by then.
func TestFakeDirectOpenFindsAnotherFile(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 300000, 13)
	replacement, _ := tempFile(t, 300000, 14)
	prev := openDirectFile
	openDirectFile = func(*os.File) (*os.File, error) {
		f, err := os.Open(replacement)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return prev(f)
	}
	defer func() { openDirectFile = prev }()
	l := e.loader(t, WithMode(ModeDirect))
	dst := e.devbuf(t, len(data))
	st, err := l.LoadFile(context.Background(), path, dst)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != ModeBuffered || st.Fallback == "" {
		t.Errorf("stats %+v, want a buffered load that says why", st)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
}

// TestFakeLoadFileWhileReplaced loads a path whose symbolic link another
// goroutine keeps switching between a small and a large file: every
// LoadFile that succeeds must have loaded one of the two files whole (not a
// prefix of the large one sized by the small one's stat).
func TestFakeLoadFileWhileReplaced(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	dir := t.TempDir()
	small, smallData := tempFile(t, 100<<10, 15)
	large, largeData := tempFile(t, 200<<10, 16)
	link := filepath.Join(dir, "current")
	defer testutil.FlipSymlink(t, link, small, large)()
	l := e.loader(t, WithMode(ModeBuffered))
	dst := e.devbuf(t, len(largeData))
	for i := range 300 {
		st, err := l.LoadFile(context.Background(), link, dst)
		if err != nil {
			if !errors.Is(err, ErrShortFile) && !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("load %d: %v", i, err)
			}
			continue
		}
		want := smallData
		if st.Bytes == int64(len(largeData)) {
			want = largeData
		}
		if off := testutil.FirstMismatch(want, e.deviceBytes(t, dst, int(st.Bytes))); off >= 0 || st.Bytes != int64(len(want)) {
			t.Fatalf("load %d delivered %d bytes that are not one whole file (first difference at %d)", i, st.Bytes, off)
		}
	}
}
