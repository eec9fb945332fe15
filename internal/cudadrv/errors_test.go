package cudadrv_test

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
)

func TestLoadNonexistent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libcuda-does-not-exist.so.1")
	d, err := cudadrv.Load(path)
	if d != nil || err == nil {
		t.Fatalf("Load(%s) = %v, %v", path, d, err)
	}
	if !errors.Is(err, cudadrv.ErrNoDriver) {
		t.Errorf("error does not match ErrNoDriver: %v", err)
	}
	if errors.Is(err, cudadrv.ErrNotSupported) {
		t.Errorf("library failure matches ErrNotSupported: %v", err)
	}
	var le *cudadrv.LoadError
	if !errors.As(err, &le) || le.Path != path || le.Symbol != "" {
		t.Fatalf("want *LoadError for %s, got %#v", path, err)
	}
}

func TestLoadErrorMissingSymbol(t *testing.T) {
	err := error(&cudadrv.LoadError{Path: "libcuda.so.1", Symbol: "cuMemHostRegister_v2", Err: cudadrv.ErrNotSupported})
	if !errors.Is(err, cudadrv.ErrNotSupported) || errors.Is(err, cudadrv.ErrNoDriver) {
		t.Errorf("missing symbol should match only ErrNotSupported: %v", err)
	}
}

var sentinels = []error{
	cudadrv.ErrNoDriver, cudadrv.ErrNoDevice, cudadrv.ErrNotSupported, cudadrv.ErrOutOfMemory,
	cudadrv.ErrInvalidValue, cudadrv.ErrNotReady, cudadrv.ErrAlreadyRegistered, cudadrv.ErrNotRegistered,
	cudadrv.ErrInvalidHandle, cudadrv.ErrKernelImage, cudadrv.ErrLaunchFailed,
}

// codeSentinels maps every Result constant of errors.go to the sentinel it must match (nil: none).
var codeSentinels = map[string]struct {
	code cudadrv.Result
	want error
}{
	"Success":                          {cudadrv.Success, nil},
	"ErrorInvalidValue":                {cudadrv.ErrorInvalidValue, cudadrv.ErrInvalidValue},
	"ErrorOutOfMemory":                 {cudadrv.ErrorOutOfMemory, cudadrv.ErrOutOfMemory},
	"ErrorNotInitialized":              {cudadrv.ErrorNotInitialized, cudadrv.ErrNoDriver},
	"ErrorDeinitialized":               {cudadrv.ErrorDeinitialized, cudadrv.ErrNoDriver},
	"ErrorStubLibrary":                 {cudadrv.ErrorStubLibrary, cudadrv.ErrNoDriver},
	"ErrorNoDevice":                    {cudadrv.ErrorNoDevice, cudadrv.ErrNoDevice},
	"ErrorInvalidDevice":               {cudadrv.ErrorInvalidDevice, cudadrv.ErrNoDevice},
	"ErrorInvalidImage":                {cudadrv.ErrorInvalidImage, cudadrv.ErrKernelImage},
	"ErrorInvalidContext":              {cudadrv.ErrorInvalidContext, cudadrv.ErrInvalidHandle},
	"ErrorNoBinaryForGPU":              {cudadrv.ErrorNoBinaryForGPU, cudadrv.ErrKernelImage},
	"ErrorNotMapped":                   {cudadrv.ErrorNotMapped, cudadrv.ErrNotRegistered},
	"ErrorInvalidPTX":                  {cudadrv.ErrorInvalidPTX, cudadrv.ErrKernelImage},
	"ErrorJITCompilerNotFound":         {cudadrv.ErrorJITCompilerNotFound, cudadrv.ErrKernelImage},
	"ErrorUnsupportedPTXVersion":       {cudadrv.ErrorUnsupportedPTXVersion, cudadrv.ErrKernelImage},
	"ErrorInvalidHandle":               {cudadrv.ErrorInvalidHandle, cudadrv.ErrInvalidHandle},
	"ErrorNotFound":                    {cudadrv.ErrorNotFound, cudadrv.ErrInvalidHandle},
	"ErrorNotReady":                    {cudadrv.ErrorNotReady, cudadrv.ErrNotReady},
	"ErrorIllegalAddress":              {cudadrv.ErrorIllegalAddress, cudadrv.ErrLaunchFailed},
	"ErrorLaunchOutOfResources":        {cudadrv.ErrorLaunchOutOfResources, cudadrv.ErrLaunchFailed},
	"ErrorLaunchTimeout":               {cudadrv.ErrorLaunchTimeout, cudadrv.ErrLaunchFailed},
	"ErrorHostMemoryAlreadyRegistered": {cudadrv.ErrorHostMemoryAlreadyRegistered, cudadrv.ErrAlreadyRegistered},
	"ErrorHostMemoryNotRegistered":     {cudadrv.ErrorHostMemoryNotRegistered, cudadrv.ErrNotRegistered},
	"ErrorLaunchFailed":                {cudadrv.ErrorLaunchFailed, cudadrv.ErrLaunchFailed},
	"ErrorNotPermitted":                {cudadrv.ErrorNotPermitted, cudadrv.ErrNotSupported},
	"ErrorNotSupported":                {cudadrv.ErrorNotSupported, cudadrv.ErrNotSupported},
	"ErrorSystemDriverMismatch":        {cudadrv.ErrorSystemDriverMismatch, cudadrv.ErrNoDriver},
	"ErrorUnknown":                     {cudadrv.ErrorUnknown, nil},
}

func TestErrorIsTable(t *testing.T) {
	fake := fakedrv.New(fakedrv.Options{})
	for name, c := range codeSentinels {
		err := &cudadrv.Error{Op: "cuTest", Code: c.code, Name: fake.ErrorName(c.code), Detail: fake.ErrorString(c.code)}
		for _, s := range sentinels {
			if got, want := errors.Is(err, s), s == c.want; got != want {
				t.Errorf("%s (%d): errors.Is(%v) = %v, want %v", name, c.code, s, got, want)
			}
		}
		if c.code != cudadrv.Success && fake.ErrorName(c.code) == "" {
			t.Errorf("%s: fake has no CUDA_ERROR_ name for %d", name, c.code)
		}
		if msg := err.Error(); !regexp.MustCompile(`^cuTest: `).MatchString(msg) {
			t.Errorf("%s: message %q", name, msg)
		}
	}
}

// TestErrorTableComplete parses errors.go so that a code added there without
// a row in codeSentinels fails.
func TestErrorTableComplete(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ast.Inspect(f, func(node ast.Node) bool {
		vs, ok := node.(*ast.ValueSpec)
		if !ok {
			return true
		}
		if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "Result" {
			for _, name := range vs.Names {
				n++
				if _, ok := codeSentinels[name.Name]; !ok {
					t.Errorf("Result constant %s has no row in the sentinel table", name.Name)
				}
			}
		}
		return true
	})
	if n != len(codeSentinels) {
		t.Errorf("errors.go has %d Result constants, the table %d", n, len(codeSentinels))
	}
}

func TestSuccessIsNil(t *testing.T) {
	d := fakedrv.New(fakedrv.Options{})
	defer d.Close()
	v, err := d.DriverGetVersion()
	if err != nil || v != 13000 {
		t.Fatalf("DriverGetVersion = %d, %v", v, err)
	}
	if err != nil { // the interface itself is nil, not a typed nil
		t.Fatal("success is a non-nil error")
	}
	for _, s := range sentinels {
		if errors.Is(&cudadrv.Error{Code: cudadrv.Success}, s) {
			t.Errorf("a success code matches %v", s)
		}
	}
}

func TestSymbolNames(t *testing.T) {
	re := regexp.MustCompile(`^cu[A-Za-z0-9_]+$`)
	seen := map[string]bool{}
	names := cudadrv.SymbolNames()
	if len(names) < 40 {
		t.Fatalf("only %d symbols", len(names))
	}
	for _, n := range names {
		if !re.MatchString(n) {
			t.Errorf("bad symbol name %q", n)
		}
		if seen[n] {
			t.Errorf("duplicate symbol %q", n)
		}
		seen[n] = true
	}
}

func TestMissingSymbolsNotReal(t *testing.T) {
	if m := cudadrv.MissingSymbols(fakedrv.New(fakedrv.Options{})); m != nil {
		t.Errorf("MissingSymbols(fake) = %v", m)
	}
	if m := cudadrv.MissingSymbols(nil); m != nil {
		t.Errorf("MissingSymbols(nil) = %v", m)
	}
}

func TestSwapRestores(t *testing.T) {
	d0, err0 := cudadrv.Get()
	fake := fakedrv.New(fakedrv.Options{})
	restore := cudadrv.Swap(fake)
	if d, err := cudadrv.Get(); d != cudadrv.Driver(fake) || err != nil {
		t.Fatalf("after Swap: Get = %v, %v", d, err)
	}
	fake2 := fakedrv.New(fakedrv.Options{})
	restore2 := cudadrv.Swap(fake2)
	if d, _ := cudadrv.Get(); d != cudadrv.Driver(fake2) {
		t.Fatal("nested Swap not installed")
	}
	restore2()
	if d, _ := cudadrv.Get(); d != cudadrv.Driver(fake) {
		t.Fatal("nested restore did not bring back the first fake")
	}
	restore()
	d, err := cudadrv.Get()
	if d != d0 || err != err0 {
		t.Fatalf("after restore: Get = %v, %v; want %v, %v", d, err, d0, err0)
	}
}

func TestSwapNilReloads(t *testing.T) {
	t.Setenv(cudadrv.EnvLibrary, filepath.Join(t.TempDir(), "nope.so"))
	restore := cudadrv.Swap(nil)
	defer restore()
	_, err := cudadrv.Get()
	var le *cudadrv.LoadError
	if !errors.As(err, &le) || filepath.Base(le.Path) != "nope.so" || !errors.Is(err, cudadrv.ErrNoDriver) {
		t.Fatalf("Get after Swap(nil) with %s set: %v", cudadrv.EnvLibrary, err)
	}
}
