package cuda

import "github.com/pinmem/pinmem/internal/cudadrv"

// Accessors the tests use and users have no need of.

// WrapEvent borrows a CUevent created by other code. pinmem never destroys it.
// With a nil c, every method of the Event returns an error matching
// ErrInvalidValue.
func WrapEvent(c *Context, handle uintptr) *Event {
	return &Event{ctx: c, h: cudadrv.Event(handle), borrowed: true}
}

// Borrowed reports whether the memory belongs to other code.
func (b *DeviceBuffer) Borrowed() bool { return b != nil && b.borrowed }

// Borrowed reports whether the context belongs to other code.
func (c *Context) Borrowed() bool { return c != nil && c.kind == ctxBorrowed }

// Handle returns the raw CUmodule (0 for a nil Module).
func (m *Module) Handle() uintptr {
	if m == nil {
		return 0
	}
	return uintptr(m.h)
}

// Handle returns the raw CUfunction (0 for a nil Function).
func (f *Function) Handle() uintptr {
	if f == nil {
		return 0
	}
	return uintptr(f.h)
}

// Name returns the kernel's name ("" for a nil Function).
func (f *Function) Name() string {
	if f == nil {
		return ""
	}
	return f.name
}

// Handle returns the raw CUdevice (-1 for a nil Device).
func (d *Device) Handle() int32 {
	if d == nil {
		return -1
	}
	return int32(d.dev)
}

// Devices returns every CUDA device.
func Devices() ([]*Device, error) {
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	out := make([]*Device, 0, n)
	for i := 0; i < n; i++ {
		d, err := GetDevice(i)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// Pub is pub, the conversion of the binding's errors.
func Pub(err error) error { return pub(err) }
