package expvars

import (
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"runtime"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/pool"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func TestPublish(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	if expvar.Get(DefaultName) != nil {
		t.Fatalf("%q is published before Publish: importing pinmem must not publish", DefaultName)
	}
	if err := Publish(""); err != nil {
		t.Fatal(err)
	}
	b, err := pinmem.Alloc(4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	var got struct {
		Pinned  pinmem.Usage            `json:"pinned"`
		ByKind  map[string]pinmem.Usage `json:"by_kind"`
		Objects pinmem.DriverObjects    `json:"driver_objects"`
	}
	if err := json.Unmarshal([]byte(expvar.Get(DefaultName).String()), &got); err != nil {
		t.Fatal(err)
	}
	want := pinmem.Stats()
	if got.Pinned != want.Pinned || got.ByKind["hostalloc"] != want.ByKind[pinmem.KindHostAlloc] || got.Pinned.Buffers < 1 {
		t.Errorf("published %+v, Stats %+v", got, want.Pinned)
	}
	// The driver objects pinmem holds are published too: the buffer's allocation among them.
	if got.Objects != want.Objects || got.Objects.HostAllocs < 1 {
		t.Errorf("published driver objects %+v, Stats %+v", got.Objects, want.Objects)
	}
	for _, name := range []string{"", DefaultName} {
		if err := Publish(name); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Publish(%q) a second time: %v, want ErrInvalidValue", name, err)
		}
	}
	expvar.NewInt("expvars-test-other")
	if err := Publish("expvars-test-other"); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Publish of a name other code took: %v", err)
	}
	if err := Publish("expvars-test-second"); err != nil {
		t.Errorf("a second name: %v", err)
	}
}

func TestPublishPool(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	if err := PublishPool("x", nil); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("nil pool: %v", err)
	}
	// Two pools may share a pool name; their expvar names differ.
	p, err := pool.New(pool.WithName("same"))
	if err != nil {
		t.Fatal(err)
	}
	if err := PublishPool("", p); err != nil {
		t.Fatal(err)
	}
	if err := PublishPool(DefaultPoolName, p); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("duplicate name: %v", err)
	}
	blk, err := p.Get(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	var got pool.Stats
	if err := json.Unmarshal([]byte(expvar.Get(DefaultPoolName).String()), &got); err != nil {
		t.Fatal(err)
	}
	if want := p.Stats(); got.Gets != want.Gets || got.Gets != 1 {
		t.Errorf("published gets %d, pool %d", got.Gets, want.Gets)
	}
	if err := p.Put(blk); err != nil {
		t.Fatal(err)
	}
	closePool(t, p)
	p = nil

	// The variable does not keep the pool alive. Nothing signals that the
	// garbage collector ran the pool's cleanup: poll, bounded.
	deadline := time.Now().Add(5 * time.Second)
	for expvar.Get(DefaultPoolName).String() != "null" && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if s := expvar.Get(DefaultPoolName).String(); s != "null" {
		t.Errorf("a collected pool reads %s, want null", s)
	}
}

// closePool closes p whether Close takes a context or not (package pool's
// Close is gaining one).
func closePool(t *testing.T, p *pool.Pool) {
	t.Helper()
	var err error
	switch c := any(p).(type) {
	case interface{ Close(context.Context) error }:
		err = c.Close(context.Background())
	case interface{ Close() error }:
		err = c.Close()
	default:
		t.Fatal("pool.Pool has no Close")
	}
	if err != nil {
		t.Fatal(err)
	}
}
