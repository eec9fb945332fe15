package cuda_test

import (
	"errors"
	"testing"

	"github.com/pinmem/pinmem/cuda"
)

// A view learns that its parent was freed: Err reports it and copies
// through the view are refused, since a real driver reuses freed addresses.
func TestDeviceBufferErrFreedParentAndViews(t *testing.T) {
	_, ctx := fakeContext(t)
	b, err := ctx.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	v, err := b.Slice(1024, 1024)
	if err != nil {
		t.Fatal(err)
	}
	vv, err := v.Slice(512, 256)
	if err != nil {
		t.Fatal(err)
	}
	for name, x := range map[string]*cuda.DeviceBuffer{"buffer": b, "view": v, "view of view": vv} {
		if err := x.Err(); err != nil {
			t.Fatalf("%s of live memory: Err = %v", name, err)
		}
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	for name, x := range map[string]*cuda.DeviceBuffer{"buffer": b, "view": v, "view of view": vv} {
		if err := x.Err(); !errors.Is(err, cuda.ErrInvalidHandle) {
			t.Errorf("%s after Free: Err = %v, want ErrInvalidHandle", name, err)
		}
	}
	if _, err := v.Slice(0, 8); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("Slice of a view of freed memory: %v, want ErrInvalidHandle", err)
	}
	if err := vv.Free(); !errors.Is(err, cuda.ErrInvalidHandle) && !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Free of a view: %v", err)
	}
	var nilBuf *cuda.DeviceBuffer
	if err := nilBuf.Err(); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("nil buffer Err = %v, want ErrInvalidValue", err)
	}
	w := cuda.WrapDevicePtr(ctx, 0x1000, 64)
	if err := w.Err(); err != nil {
		t.Errorf("borrowed buffer Err = %v, want nil", err)
	}
}
