package prom

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	itest "github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/pool"
)

func TestMain(m *testing.M) { itest.Main(m) }

func TestCollector(t *testing.T) {
	s := pinmem.LedgerStats{
		Pinned:    pinmem.Usage{Bytes: 300, Buffers: 3},
		PeakBytes: 500,
		ByKind: map[pinmem.Kind]pinmem.Usage{
			pinmem.KindHostAlloc: {Bytes: 100, Buffers: 1}, pinmem.KindMmapRegister: {Bytes: 200, Buffers: 2},
		},
		ByFlags:          map[pinmem.Flags]pinmem.Usage{pinmem.Portable | pinmem.Mapped: {Bytes: 300, Buffers: 3}},
		Allocs:           7,
		Frees:            4,
		AllocBytes:       1000,
		Failures:         2,
		BudgetRejections: 1,
		PinTime:          1500 * time.Millisecond,
		UnpinTime:        250 * time.Millisecond,
		Budget:           1 << 30,
		Objects:          pinmem.DriverObjects{Streams: 4, Events: 8, DeviceAllocs: 2, DeviceBytes: 4096, HostAllocs: 3, Registrations: 5},
	}
	c := newLedgerCollector(func() pinmem.LedgerStats { return s })
	want := `
# HELP pinmem_pinned_bytes Host memory pinned by pinmem now, by kind (hostalloc, mmap-register, go-register).
# TYPE pinmem_pinned_bytes gauge
pinmem_pinned_bytes{kind="go-register"} 0
pinmem_pinned_bytes{kind="hostalloc"} 100
pinmem_pinned_bytes{kind="mmap-register"} 200
# HELP pinmem_pinned_bytes_by_flags Host memory pinned now, by the buffers' flags.
# TYPE pinmem_pinned_bytes_by_flags gauge
pinmem_pinned_bytes_by_flags{flags="portable|mapped"} 300
# HELP pinmem_pinned_peak_bytes Highest pinned total seen.
# TYPE pinmem_pinned_peak_bytes gauge
pinmem_pinned_peak_bytes 500
# HELP pinmem_budget_bytes The pinned memory budget of the process.
# TYPE pinmem_budget_bytes gauge
pinmem_budget_bytes 1.073741824e+09
# HELP pinmem_allocs_total Successful pins (Alloc and Register).
# TYPE pinmem_allocs_total counter
pinmem_allocs_total 7
# HELP pinmem_budget_rejections_total Requests refused because of the budget.
# TYPE pinmem_budget_rejections_total counter
pinmem_budget_rejections_total 1
# HELP pinmem_pin_seconds_total Time spent pinning.
# TYPE pinmem_pin_seconds_total counter
pinmem_pin_seconds_total 1.5
# HELP pinmem_unpin_seconds_total Time spent releasing pinned memory.
# TYPE pinmem_unpin_seconds_total counter
pinmem_unpin_seconds_total 0.25
# HELP pinmem_driver_objects Driver objects pinmem holds now, by kind (stream, event, module, context, device_alloc, host_alloc, registration).
# TYPE pinmem_driver_objects gauge
pinmem_driver_objects{kind="context"} 0
pinmem_driver_objects{kind="device_alloc"} 2
pinmem_driver_objects{kind="event"} 8
pinmem_driver_objects{kind="host_alloc"} 3
pinmem_driver_objects{kind="module"} 0
pinmem_driver_objects{kind="registration"} 5
pinmem_driver_objects{kind="stream"} 4
# HELP pinmem_device_bytes Device memory pinmem holds allocated now.
# TYPE pinmem_device_bytes gauge
pinmem_device_bytes 4096
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"pinmem_pinned_bytes", "pinmem_pinned_bytes_by_flags", "pinmem_pinned_peak_bytes", "pinmem_budget_bytes",
		"pinmem_allocs_total", "pinmem_budget_rejections_total", "pinmem_pin_seconds_total", "pinmem_unpin_seconds_total",
		"pinmem_driver_objects", "pinmem_device_bytes"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c); n != 26 {
		t.Errorf("%d metrics, want 26", n)
	}
	if _, err := testutil.CollectAndLint(c); err != nil {
		t.Error(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(NewCollector()); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

// The collector reads the driver objects pinmem holds at each scrape: a
// stream created shows, and is gone once destroyed.
func TestCollectorDriverObjects(t *testing.T) {
	itest.UseFake(t, fakedrv.Options{})
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	c := NewCollector()
	want := func(streams int64) string {
		o := pinmem.Stats().Objects
		return fmt.Sprintf(`
# HELP pinmem_driver_objects Driver objects pinmem holds now, by kind (stream, event, module, context, device_alloc, host_alloc, registration).
# TYPE pinmem_driver_objects gauge
pinmem_driver_objects{kind="context"} %d
pinmem_driver_objects{kind="device_alloc"} %d
pinmem_driver_objects{kind="event"} %d
pinmem_driver_objects{kind="host_alloc"} %d
pinmem_driver_objects{kind="module"} %d
pinmem_driver_objects{kind="registration"} %d
pinmem_driver_objects{kind="stream"} %d
`, o.Contexts, o.DeviceAllocs, o.Events, o.HostAllocs, o.Modules, o.Registrations, streams)
	}
	before := pinmem.Stats().Objects.Streams
	s, err := ctx.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want(before+1)), "pinmem_driver_objects"); err != nil {
		t.Errorf("with one stream more: %v", err)
	}
	if err := s.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want(before)), "pinmem_driver_objects"); err != nil {
		t.Errorf("after Destroy: %v", err)
	}
}

func TestPoolCollector(t *testing.T) {
	itest.UseFake(t, fakedrv.Options{})
	p, err := pool.New(pool.WithName("staging"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	b, err := p.Get(context.Background(), 1500)
	if err != nil {
		t.Fatal(err)
	}
	c := NewPoolCollector(p)
	want := `
# HELP pinmem_pool_gets_total Successful Get calls.
# TYPE pinmem_pool_gets_total counter
pinmem_pool_gets_total{pool="staging"} 1
# HELP pinmem_pool_misses_total Gets that pinned new memory.
# TYPE pinmem_pool_misses_total counter
pinmem_pool_misses_total{pool="staging"} 1
# HELP pinmem_pool_in_use_bytes Capacity of the blocks in use.
# TYPE pinmem_pool_in_use_bytes gauge
pinmem_pool_in_use_bytes{pool="staging"} 1536
# HELP pinmem_pool_requested_bytes Bytes requested by the Gets of the blocks in use.
# TYPE pinmem_pool_requested_bytes gauge
pinmem_pool_requested_bytes{pool="staging"} 1500
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"pinmem_pool_gets_total", "pinmem_pool_misses_total", "pinmem_pool_in_use_bytes", "pinmem_pool_requested_bytes"); err != nil {
		t.Error(err)
	}
	if err := p.Put(b); err != nil {
		t.Fatal(err)
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP pinmem_pool_puts_total Blocks given back with Put.
# TYPE pinmem_pool_puts_total counter
pinmem_pool_puts_total{pool="staging"} 1
`), "pinmem_pool_puts_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c); n != 15 {
		t.Errorf("%d pool metrics, want 15", n)
	}
	if _, err := testutil.CollectAndLint(c); err != nil {
		t.Error(err)
	}
	// Pools registered together need distinct names; the registry says so.
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	q, err := pool.New(pool.WithName("staging"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close(context.Background())
	var are prometheus.AlreadyRegisteredError
	if err := reg.Register(NewPoolCollector(q)); !errors.As(err, &are) {
		t.Errorf("second collector of the same name: %v", err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}
