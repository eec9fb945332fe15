package remote

import (
	"context"
	"errors"
	"testing"

	"github.com/pinmem/pinmem/cuda"
)

// TestNilAndZeroValues: every method of a nil or zero Agent, Region and
// Remote (and a transfer with a zero Region) returns an error matching
// cuda.ErrInvalidValue, or its zero result, instead of panicking.
func TestNilAndZeroValues(t *testing.T) {
	ctx := context.Background()
	for _, a := range []*Agent{nil, {}} {
		for name, err := range map[string]error{
			"Register": func() error { _, err := a.Register(ctx, make([]byte, 1)); return err }(),
			"Alloc":    func() error { _, err := a.Alloc(ctx, 4096); return err }(),
			"Import":   func() error { _, err := a.Import(ctx, nil); return err }(),
			"Close":    a.Close(ctx),
		} {
			if !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("Agent(%v).%s: %v, want cuda.ErrInvalidValue", a == nil, name, err)
			}
		}
		if s := a.Stats(); s != (Stats{}) {
			t.Errorf("Agent(%v).Stats: %+v", a == nil, s)
		}
	}
	for _, r := range []*Region{nil, {}} {
		if err := r.Close(); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Region(%v).Close: %v, want cuda.ErrInvalidValue", r == nil, err)
		}
		if r.Key() != nil || r.Bytes() != nil || r.Len() != 0 || r.Registrations() != nil {
			t.Errorf("Region(%v): a key, bytes, length or registrations", r == nil)
		}
	}
	for _, r := range []*Remote{nil, {}} {
		for name, err := range map[string]error{
			"Put":   r.Put(ctx, &Region{}, []Block{{Len: 1}}),
			"Get":   r.Get(ctx, &Region{}, []Block{{Len: 1}}),
			"Close": r.Close(),
		} {
			if !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("Remote(%v).%s: %v, want cuda.ErrInvalidValue", r == nil, name, err)
			}
		}
		if r.Len() != 0 {
			t.Errorf("Remote(%v).Len: %d", r == nil, r.Len())
		}
	}
}
