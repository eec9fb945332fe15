package pinmem

import (
	"testing"

	"github.com/pinmem/pinmem/internal/pinopt"
)

// TestOptionValues: internal/pinopt, which validates the options, numbers
// methods and NUMA choices as this package does.
func TestOptionValues(t *testing.T) {
	for _, c := range []struct {
		name       string
		ours, pins int
	}{
		{"MethodAuto", int(MethodAuto), int(pinopt.MethodAuto)},
		{"MethodHostAlloc", int(MethodHostAlloc), int(pinopt.MethodHostAlloc)},
		{"MethodMmapRegister", int(MethodMmapRegister), int(pinopt.MethodMmapRegister)},
		{"NUMAAuto", NUMAAuto, pinopt.NUMAAuto},
		{"NUMANone", NUMANone, pinopt.NUMANone},
	} {
		if c.ours != c.pins {
			t.Errorf("%s is %d, pinopt's %d", c.name, c.ours, c.pins)
		}
	}
}
