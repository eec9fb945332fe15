package pool

import (
	"context"
	"errors"
	"runtime/debug"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// noPanic runs f and reports a panic as a test failure.
func noPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s panicked: %v\n%s", what, r, debug.Stack())
		}
	}()
	f()
}

// TestNilAndForeign: every method of a nil *Pool, a zero Pool and a nil
// *Block, and Put of a nil, foreign or returned block, returns a typed
// error (or a zero value) and never panics.
func TestNilAndForeign(t *testing.T) {
	useFake(t)
	bg := context.Background()
	for _, tc := range []struct {
		name string
		p    *Pool
	}{{"nil", nil}, {"zero", &Pool{}}} {
		p := tc.p
		noPanic(t, tc.name+" Get", func() {
			if b, err := p.Get(10); b != nil || !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s pool: Get: %v, %v", tc.name, b, err)
			}
		})
		noPanic(t, tc.name+" Put", func() {
			if err := p.Put(&Block{}); !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s pool: Put: %v", tc.name, err)
			}
		})
		noPanic(t, tc.name+" Trim", func() {
			if _, err := p.Trim(); !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s pool: Trim: %v", tc.name, err)
			}
		})
		noPanic(t, tc.name+" Close", func() {
			if err := p.Close(bg); !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s pool: Close: %v", tc.name, err)
			}
		})
		noPanic(t, tc.name+" Stats", func() {
			if s := p.Stats(); s != (Stats{}) {
				t.Errorf("%s pool: Stats %v", tc.name, s)
			}
		})
		noPanic(t, tc.name+" Name/Flags", func() {
			if p.Name() != "" || p.Flags() != 0 {
				t.Errorf("%s pool: name %q, flags %v", tc.name, p.Name(), p.Flags())
			}
		})
	}
	for _, tc := range []struct {
		name string
		b    *Block
	}{{"nil", nil}, {"zero", &Block{}}} {
		b := tc.b
		noPanic(t, tc.name+" block", func() {
			if b.Bytes() != nil || b.Segments() != nil || b.Len() != 0 || b.Cap() != 0 || b.ID() != 0 {
				t.Errorf("%s block: %v %v %d %d %d", tc.name, b.Bytes(), b.Segments(), b.Len(), b.Cap(), b.ID())
			}
			if _, err := b.DevicePtr(); !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s block: DevicePtr: %v", tc.name, err)
			}
		})
	}

	p, q := newPool(t), newPool(t)
	b := mustGet(t, p, 100)
	noPanic(t, "Put misuse", func() {
		if err := p.Put(nil); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Put(nil): %v", err)
		}
		if err := p.Put(&Block{}); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Put of a zero block: %v", err)
		}
		if err := q.Put(b); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Put into another pool: %v", err)
		}
		mustPut(t, p, b)
		if err := p.Put(b); !errors.Is(err, pinmem.ErrFreed) {
			t.Errorf("second Put: %v", err)
		}
		//lint:ignore SA1012 a nil context is the input under test
		if err := p.Close(nil); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Close(nil): %v", err)
		}
	})
	// The refused calls changed nothing: the pool still works.
	mustPut(t, p, mustGet(t, p, 100))
	if s := p.Stats(); s.Gets != 2 || s.Puts != 2 || s.InUseBlocks != 0 {
		t.Errorf("after the misuse: %v", s)
	}
}
