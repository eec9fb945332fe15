package pinmem

import (
	"errors"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestCapsTransientFailure fails each cuDeviceGetAttribute call that the
// first Alloc makes, once, in turn: that Alloc may fail,
// with the driver's error, but the next Alloc(Mapped), Register(Mapped)
// and MethodMmapRegister must work. A capability guessed after the failed
// read and cached would refuse them for good.
func TestCapsTransientFailure(t *testing.T) {
	const op = "cuDeviceGetAttribute"
	d := testutil.UseFake(t, fakedrv.Options{})
	b, err := Alloc(4096, Mapped)
	if err != nil {
		t.Fatal(err)
	}
	mustFree(t, b)
	reads := d.Calls(op)
	if reads == 0 {
		t.Fatal("Alloc read no device attribute")
	}
	for nth := 1; nth <= reads; nth++ {
		d := testutil.UseFake(t, fakedrv.Options{})
		if err := d.FailOn(op, nth, cudadrv.ErrorUnknown); err != nil {
			t.Fatal(err)
		}
		if b, err := Alloc(4096, Mapped); err == nil {
			mustFree(t, b)
		} else if !errorsHasCode(err, cudadrv.ErrorUnknown) {
			t.Errorf("read %d failed: Alloc returned %v, want the driver's error", nth, err)
		}
		b, err := Alloc(4096, Mapped)
		if err != nil {
			t.Fatalf("read %d of %d failed once: the next Alloc(Mapped): %v", nth, reads, err)
		}
		mustFree(t, b)
		r, err := Register(make([]byte, 8192), Mapped|ReadOnly)
		if err != nil {
			t.Fatalf("read %d of %d failed once: the next Register(Mapped|ReadOnly): %v", nth, reads, err)
		}
		mustFree(t, r)
		m, err := Alloc(1<<20, 0, WithMethod(MethodMmapRegister))
		if err != nil {
			t.Fatalf("read %d of %d failed once: the next MethodMmapRegister: %v", nth, reads, err)
		}
		mustFree(t, m)
	}
}

func errorsHasCode(err error, code cudadrv.Result) bool {
	var de *cuda.Error
	return errors.As(err, &de) && de.Code == cuda.Result(code)
}
