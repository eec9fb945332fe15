package pinmem

import (
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// Stats counts the driver objects pinmem holds, whichever package created
// them, as they are created and released.
func TestStatsCountDriverObjects(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	setChunk(t, 1<<20)
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	base := Stats().Objects
	check := func(when string, want DriverObjects) {
		t.Helper()
		got := Stats().Objects
		got.Streams -= base.Streams
		got.Events -= base.Events
		got.Modules -= base.Modules
		got.Contexts -= base.Contexts
		got.DeviceAllocs -= base.DeviceAllocs
		got.DeviceBytes -= base.DeviceBytes
		got.HostAllocs -= base.HostAllocs
		got.Registrations -= base.Registrations
		if got != want {
			t.Errorf("%s: driver objects %+v, want %+v", when, got, want)
		}
	}
	s1 := mustGet(ctx.NewStream(0))(t)
	s2 := mustGet(ctx.NewStream(cuda.StreamNonBlocking))(t)
	ev := mustGet(ctx.NewEvent(0))(t)
	mod := mustGet(ctx.LoadModule([]byte("// fake PTX\n")))(t)
	buf := mustGet(ctx.Alloc(1000))(t)
	own := mustGet(cuda.NewContext(dev, 0))(t)
	small := mustGet(Alloc(12, 0, WithMethod(MethodHostAlloc)))(t)
	small2 := mustGet(Alloc(12, 0, WithMethod(MethodHostAlloc)))(t)
	mapped := mustGet(Alloc(3<<20, 0, WithMethod(MethodMmapRegister)))(t) // 3 registrations of 1 MiB
	goMem := make([]byte, 100)
	reg := mustGet(Register(goMem, 0))(t)
	want := DriverObjects{Streams: 2, Events: 1, Modules: 1, Contexts: 1, DeviceAllocs: 1, DeviceBytes: 1000, HostAllocs: 2, Registrations: 4}
	check("after creating", want)
	if l := d.Live(); l.Streams != 2 || l.Events != 1 || l.Modules != 1 || l.DeviceAllocs != 1 || l.HostAllocs != 2 || l.Registrations != 4 {
		t.Errorf("the fake counts %+v", l)
	}
	if err := own.Destroy(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []func() error{s1.Destroy, ev.Destroy, mod.Destroy, buf.Free, small.Free, mapped.Free} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	check("after releasing some", DriverObjects{Streams: 1, HostAllocs: 1, Registrations: 1})
	for _, f := range []func() error{s2.Destroy, small2.Free, reg.Free} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	check("after releasing all", DriverObjects{})
}

func mustGet[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}
