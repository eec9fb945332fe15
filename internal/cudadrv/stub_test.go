package cudadrv_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/pinmem/pinmem/internal/cudadrv"
)

// stubLibrary builds testdata/stubcuda.c into a shared library with the
// system C compiler, so the purego binding itself (symbol binding, argument
// and out-parameter passing, error names, missing symbols) is tested on
// machines without a GPU. It skips when no C compiler is installed: this
// is not a GPU test, and the GPU suite tests the binding against the real
// driver.
func stubLibrary(t *testing.T) string {
	t.Helper()
	cc := ""
	for _, c := range []string{os.Getenv("CC"), "cc", "gcc", "clang"} {
		if c != "" {
			if p, err := exec.LookPath(c); err == nil {
				cc = p
				break
			}
		}
	}
	if cc == "" {
		t.Skip("no C compiler to build the stub driver library")
	}
	out := filepath.Join(t.TempDir(), "libstubcuda.so")
	cmd := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", out, "testdata/stubcuda.c")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, b)
	}
	return out
}

// TestStubLibraryBinding checks the binding through both call paths:
// pinmem's own trampoline (the default) and purego.SyscallN.
func TestStubLibraryBinding(t *testing.T) {
	path := stubLibrary(t)
	for _, viaPurego := range []bool{false, true} {
		name := "trampoline"
		if viaPurego {
			name = "purego"
		}
		t.Run(name, func(t *testing.T) {
			if viaPurego && !cudadrv.PuregoSwitch {
				t.Skip("the purego call path exists only with -tags pinmem_purego")
			}
			prev := cudadrv.UsePuregoCalls(viaPurego)
			defer cudadrv.UsePuregoCalls(prev)
			testStubBinding(t, path)
		})
	}
}

func testStubBinding(t *testing.T, path string) {
	d, err := cudadrv.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := d.DriverGetVersion(); err != nil || v != 12080 {
		t.Errorf("DriverGetVersion = %d, %v", v, err)
	}
	if n, err := d.DeviceGetCount(); err != nil || n != 1 {
		t.Errorf("DeviceGetCount = %d, %v", n, err)
	}
	if name, err := d.DeviceGetName(0); err != nil || name != "Stub GPU" {
		t.Errorf("DeviceGetName = %q, %v", name, err)
	}
	if v, err := d.DeviceGetAttribute(cudadrv.AttrMultiprocessorCount, 0); err != nil || v != int(cudadrv.AttrMultiprocessorCount) {
		t.Errorf("DeviceGetAttribute = %d, %v", v, err)
	}
	if b, err := d.DeviceTotalMem(0); err != nil || b != 1<<34 {
		t.Errorf("DeviceTotalMem = %d, %v", b, err)
	}
	if p, err := d.MemAlloc(4096); err != nil || p != 0x7f0000001000 {
		t.Errorf("MemAlloc = %#x, %v", p, err)
	}

	// A failing call: the error carries op, code, and the library's own name and text.
	_, err = d.MemAlloc(1 << 41)
	var de *cudadrv.Error
	if !errors.As(err, &de) || de.Op != "cuMemAlloc_v2" || de.Code != cudadrv.ErrorOutOfMemory ||
		de.Name != "CUDA_ERROR_OUT_OF_MEMORY" || de.Detail != "out of memory" || !errors.Is(err, cudadrv.ErrOutOfMemory) {
		t.Errorf("MemAlloc(2 TiB) = %#v", err)
	}
	if _, err := d.DeviceGet(3); !errors.Is(err, cudadrv.ErrNoDevice) {
		t.Errorf("DeviceGet(3) = %v, want ErrNoDevice", err)
	}

	// cuEventElapsedTime_v2 is missing: the binding falls back to the old entry point.
	if ms, err := d.EventElapsedTime(0x10, 0x20); err != nil || ms != 1.5 {
		t.Errorf("EventElapsedTime = %v, %v", ms, err)
	}

	// Eleven arguments, five of them on the stack, and a parameter block.
	vals := []uint64{0x1122334455667788, 0xab}
	params, release := cudadrv.KernelParams(vals)
	err = d.LaunchKernel(0xf00d, [3]uint32{2, 3, 4}, [3]uint32{5, 6, 7}, 8, 0x9, params)
	release()
	if err != nil {
		t.Errorf("LaunchKernel: the stub saw different arguments: %v", err)
	}

	// A symbol the library lacks is a typed error, never a panic.
	buf := make([]byte, 4096)
	err = d.MemHostRegister(unsafe.Pointer(&buf[0]), 4096, 0)
	var le *cudadrv.LoadError
	if !errors.As(err, &le) || le.Symbol != "cuMemHostRegister_v2" || !errors.Is(err, cudadrv.ErrNotSupported) || errors.Is(err, cudadrv.ErrNoDriver) {
		t.Errorf("MemHostRegister on a library without it = %v", err)
	}
	if _, err := d.StreamCreate(0); !errors.Is(err, cudadrv.ErrNotSupported) {
		t.Errorf("StreamCreate on a library without it = %v", err)
	}
	missing := cudadrv.MissingSymbols(d)
	for _, want := range []string{"cuMemHostRegister_v2", "cuStreamCreate", "cuEventElapsedTime"} {
		if want == "cuEventElapsedTime" {
			if slices.Contains(missing, want) {
				t.Errorf("MissingSymbols lists %s, which the stub has", want)
			}
			continue
		}
		if !slices.Contains(missing, want) {
			t.Errorf("MissingSymbols lacks %s: %v", want, missing)
		}
	}
	if got := d.ErrorName(cudadrv.Result(12345)); got != "" {
		t.Errorf("ErrorName of an unknown code = %q, want empty", got)
	}
}

func TestStubLibraryInitFailures(t *testing.T) {
	path := stubLibrary(t)
	t.Setenv("PINMEM_STUB_INIT", "nodevice")
	_, err := cudadrv.Load(path)
	if !errors.Is(err, cudadrv.ErrNoDevice) {
		t.Errorf("cuInit returning NO_DEVICE: %v, want ErrNoDevice", err)
	}
	t.Setenv("PINMEM_STUB_INIT", "fail")
	_, err = cudadrv.Load(path)
	var le *cudadrv.LoadError
	if !errors.As(err, &le) || !errors.Is(err, cudadrv.ErrNoDriver) {
		t.Errorf("cuInit failing: %v, want a *LoadError matching ErrNoDriver", err)
	}
	// A library without cuInit at all (libc) is not a driver.
	if _, err := cudadrv.Load("libc.so.6"); !errors.Is(err, cudadrv.ErrNoDriver) {
		t.Errorf("Load(libc) = %v, want ErrNoDriver", err)
	}
}

// TestStubLibraryBatch issues batches through the stub library: ops run in
// order with one crossing per 16, a failing op stops the batch (it and
// everything after it not issued) and comes back as a typed error naming
// the call, on both the trampoline and the purego path.
func TestStubLibraryBatch(t *testing.T) {
	path := stubLibrary(t)
	d, err := cudadrv.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	takeLog, err := purego.Dlsym(h, "stub_take_log")
	if err != nil {
		t.Fatal(err)
	}
	take := func() []uint64 {
		out := make([]uint64, 64)
		n, _, _ := purego.SyscallN(takeLog, uintptr(unsafe.Pointer(&out[0])))
		return out[:n]
	}
	host := []byte{1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	hp := unsafe.Pointer(&host[0])
	for _, viaPurego := range []bool{false, true} {
		t.Run(map[bool]string{false: "trampoline", true: "purego"}[viaPurego], func(t *testing.T) {
			if viaPurego && !cudadrv.PuregoSwitch {
				t.Skip("the purego call path exists only with -tags pinmem_purego")
			}
			defer cudadrv.UsePuregoCalls(cudadrv.UsePuregoCalls(viaPurego))
			take()
			ops := []cudadrv.BatchOp{
				{Kind: cudadrv.BatchCopyHtoD, Dev: 0x1000, Host: hp, N: 4, Stream: 7},
				{Kind: cudadrv.BatchEventRecord, Event: 5, Stream: 7},
				{Kind: cudadrv.BatchCopyHtoD, Dev: 0x2000, Host: hp, N: 13, Stream: 7}, // the stub fails it
				{Kind: cudadrv.BatchEventRecord, Event: 6, Stream: 7},
			}
			n, err := cudadrv.RunBatch(d, ops)
			var de *cudadrv.Error
			if n != 2 || !errors.As(err, &de) || de.Op != "cuMemcpyHtoDAsync_v2" || !errors.Is(err, cudadrv.ErrInvalidValue) {
				t.Fatalf("RunBatch = %d, %v; want 2 issued and cuMemcpyHtoDAsync_v2's INVALID_VALUE", n, err)
			}
			if got, want := take(), []uint64{0x1000 + 10 + 7, 5007}; !slices.Equal(got, want) {
				t.Fatalf("the stub saw %v, want %v", got, want)
			}
			// 40 ops: three crossings, all in order.
			ops = ops[:0]
			var want []uint64
			for i := range 40 {
				if i%2 == 0 {
					ops = append(ops, cudadrv.BatchOp{Kind: cudadrv.BatchEventRecord, Event: cudadrv.Event(i), Stream: 3})
					want = append(want, uint64(i)*1000+3)
				} else {
					ops = append(ops, cudadrv.BatchOp{Kind: cudadrv.BatchCopyHtoD, Dev: cudadrv.DevicePtr(i), Host: hp, N: 2, Stream: 1})
					want = append(want, uint64(i)+3+1)
				}
			}
			if n, err := cudadrv.RunBatch(d, ops); n != 40 || err != nil {
				t.Fatalf("RunBatch of 40 = %d, %v", n, err)
			}
			if got := take(); !slices.Equal(got, want) {
				t.Fatalf("the stub saw %v,\nwant %v", got, want)
			}
			// An op kind the binding does not know is an error, after the ones before it.
			n, err = cudadrv.RunBatch(d, []cudadrv.BatchOp{{Kind: cudadrv.BatchEventRecord, Event: 9, Stream: 1}, {Kind: 99}})
			if n != 1 || !errors.Is(err, cudadrv.ErrInvalidValue) {
				t.Fatalf("RunBatch with a bad kind = %d, %v", n, err)
			}
			if got := take(); !slices.Equal(got, []uint64{9001}) {
				t.Fatalf("the stub saw %v, want [9001]", got)
			}
		})
	}
}

// TestStubLibraryNoAllocs checks that a hot driver call through the
// trampoline allocates nothing on the Go heap: ccall's variadic arguments
// must stay on the caller's stack (they escaped before, costing an
// allocation per call).
func TestStubLibraryNoAllocs(t *testing.T) {
	d, err := cudadrv.Load(stubLibrary(t))
	if err != nil {
		t.Fatal(err)
	}
	host := make([]byte, 4)
	hp := unsafe.Pointer(&host[0])
	if n := testing.AllocsPerRun(100, func() {
		if err := d.MemcpyHtoDAsync(0x1000, hp, 4, 7); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("MemcpyHtoDAsync allocates %.1f times per call, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := d.EventRecord(5, 7); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("EventRecord allocates %.1f times per call, want 0", n)
	}
}

// TestStubLibraryOutParamsSurviveStackGrowth calls the out-parameter paths
// (cuGetErrorName, cuGetErrorString, cuDriverGetVersion) each first thing in
// a fresh goroutine under every stack depth from shallow to past the first
// stack growth, so that at some depth the goroutine's stack is copied while
// the call is on its way into C. An out-parameter left on the old stack
// comes back unset: the name empty (a bug the GPU suite caught under
// compute-sanitizer).
func TestStubLibraryOutParamsSurviveStackGrowth(t *testing.T) {
	d, err := cudadrv.Load(stubLibrary(t))
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() string{
		"ErrorName":   func() string { return d.ErrorName(1) },
		"ErrorString": func() string { return d.ErrorString(1) },
		"DriverGetVersion": func() string {
			v, err := d.DriverGetVersion()
			return fmt.Sprint(v, err)
		},
	}
	want := map[string]string{"ErrorName": "CUDA_ERROR_INVALID_VALUE", "ErrorString": "invalid argument", "DriverGetVersion": "12080 <nil>"}
	for name, call := range calls {
		for depth := 0; depth < 1200; depth++ {
			ch := make(chan string)
			go func() { ch <- atDepth(depth, call) }()
			if got := <-ch; got != want[name] {
				t.Fatalf("%s under %d frames = %q, want %q", name, depth, got, want[name])
			}
		}
	}
}

// atDepth calls f under depth small frames.
//
//go:noinline
func atDepth(depth int, f func() string) string {
	if depth == 0 {
		return f()
	}
	return atDepth(depth-1, f)
}

// TestStubLibraryBatchCopy loads the stub as a 12.4, a 12.8 and a 13.0
// driver and checks that the binding calls the batch-copy form the
// version's cuda.h names (cuMemcpyBatchAsync with failIdx on 12.8,
// cuMemcpyBatchAsync_v2 without it on 13.0, none on 12.4), that the
// arrays and the CUmemcpyAttributes layout arrive as C reads them (the
// stub logs every field), and that a rejected copy comes back typed, with
// its index where the 12.8 form reports one.
func TestStubLibraryBatchCopy(t *testing.T) {
	path := stubLibrary(t)
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	takeLog, err := purego.Dlsym(h, "stub_take_log")
	if err != nil {
		t.Fatal(err)
	}
	take := func() []uint64 {
		out := make([]uint64, 64)
		n, _, _ := purego.SyscallN(takeLog, uintptr(unsafe.Pointer(&out[0])))
		return out[:n]
	}
	for _, c := range []struct {
		version string
		sym     string
		form    uint64
	}{
		{"12040", "", 0},
		{"12080", cudadrv.SymMemcpyBatchAsyncV1, 1},
		{"12090", cudadrv.SymMemcpyBatchAsyncV1, 1},
		{"13000", cudadrv.SymMemcpyBatchAsyncV2, 2},
		{"13010", cudadrv.SymMemcpyBatchAsyncV2, 2},
	} {
		t.Run(c.version, func(t *testing.T) {
			t.Setenv("PINMEM_STUB_VERSION", c.version)
			d, err := cudadrv.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := cudadrv.BatchCopySymbolOf(d); got != c.sym {
				t.Fatalf("BatchCopySymbolOf = %q, want %q", got, c.sym)
			}
			bc, ok := d.(cudadrv.BatchCopier)
			if !ok {
				t.Fatal("the binding does not implement BatchCopier")
			}
			take()
			dsts := []cudadrv.DevicePtr{0x1000, 0x2000, 0x3000}
			srcs := []cudadrv.DevicePtr{0x10, 0x20, 0x30}
			sizes := []uint64{4, 8, 9}
			attrs := []cudadrv.MemcpyAttributes{
				{SrcAccessOrder: cudadrv.MemcpySrcAccessOrderStream, SrcLocType: 2, SrcLocID: 3, DstLocType: 4, DstLocID: 5, Flags: 1},
				{SrcAccessOrder: cudadrv.MemcpySrcAccessOrderAny, SrcLocType: 6, SrcLocID: 7, DstLocType: 8, DstLocID: 9},
			}
			idxs := []uint64{0, 2}
			fail, err := bc.MemcpyBatchAsync(dsts, srcs, sizes, attrs, idxs, 7)
			if c.sym == "" {
				var le *cudadrv.LoadError
				if !errors.As(err, &le) || !errors.Is(err, cudadrv.ErrNotSupported) || le.Symbol != cudadrv.SymMemcpyBatchAsyncV1 {
					t.Fatalf("batch copy on a 12.4 driver = %v, want a *LoadError for %s matching ErrNotSupported", err, cudadrv.SymMemcpyBatchAsyncV1)
				}
				if got := take(); len(got) != 0 {
					t.Fatalf("the stub was called: %v", got)
				}
				return
			}
			if err != nil || fail != -1 {
				t.Fatalf("MemcpyBatchAsync = %d, %v", fail, err)
			}
			want := []uint64{
				1*1000000 + 1*100000 + 2*10000 + 3*1000 + 4*100 + 5*10 + c.form, 0,
				3*1000000 + 0 + 6*10000 + 7*1000 + 8*100 + 9*10 + c.form, 2,
				0x1000 + 0x10 + 4, 0x2000 + 0x20 + 8, 0x3000 + 0x30 + 9,
			}
			if got := take(); !slices.Equal(got, want) {
				t.Fatalf("the stub saw %v, want %v", got, want)
			}
			// A rejected copy: typed, named after the form called; the 12.8 form says which.
			sizes[1] = 13
			fail, err = bc.MemcpyBatchAsync(dsts, srcs, sizes, attrs, idxs, 7)
			var de *cudadrv.Error
			if !errors.As(err, &de) || de.Op != c.sym || !errors.Is(err, cudadrv.ErrInvalidValue) {
				t.Fatalf("a rejected batch = %v, want %s's INVALID_VALUE", err, c.sym)
			}
			wantFail := -1
			if c.form == 1 {
				wantFail = 1
			}
			if fail != wantFail {
				t.Errorf("failIdx = %d, want %d", fail, wantFail)
			}
			// Mismatched arrays never reach C.
			if _, err := bc.MemcpyBatchAsync(dsts, srcs[:2], sizes, attrs, idxs, 7); !errors.Is(err, cudadrv.ErrInvalidValue) {
				t.Errorf("mismatched arrays = %v, want ErrInvalidValue", err)
			}
			if got := take(); len(got) != 0 {
				t.Fatalf("the stub logged %v for rejected batches", got)
			}
		})
	}
}
