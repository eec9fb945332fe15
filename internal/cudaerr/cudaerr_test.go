package cudaerr

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
)

// Public gives the binding's errors cuda's types with the same fields and
// the same sentinel, and leaves other errors alone.
func TestPublic(t *testing.T) {
	drv := &cudadrv.Error{Op: "cuMemAlloc_v2", Code: cudadrv.ErrorOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY", Detail: "out of memory"}
	err := fmt.Errorf("wrapped: %w", Public(drv))
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Op != drv.Op || ce.Code != cuda.ResultOutOfMemory || ce.Name != drv.Name || ce.Message != drv.Detail {
		t.Errorf("Public(%v) = %+v", drv, ce)
	}
	if !errors.Is(err, cuda.ErrOutOfMemory) || ce.Error() != drv.Error() {
		t.Errorf("%v: sentinel or text differ from the binding's %v", err, drv)
	}
	load := &cudadrv.LoadError{Path: "libcuda.so.1", Symbol: "cuX", Err: errors.New("missing")}
	var le *cuda.LoadError
	if err := Public(load); !errors.As(err, &le) || le.Symbol != "cuX" || !errors.Is(err, cuda.ErrNotSupported) {
		t.Errorf("Public(%v) = %v", load, err)
	}
	other := errors.New("other")
	if Public(other) != other || Public(nil) != nil {
		t.Error("Public changed an error that is not the binding's")
	}
	if v, err := Public2(7, drv); v != 7 || !errors.As(err, &ce) {
		t.Errorf("Public2 = %d, %v", v, err)
	}
}
