package enumtext

import "testing"

func TestIndex(t *testing.T) {
	names := []string{"auto", "per-copy"}
	for name, want := range map[string]int{"auto": 0, " Per-Copy ": 1, "PER-COPY": 1, "": -1, "percopy": -1, "auto ": 0} {
		if got := Index(names, name); got != want {
			t.Errorf("Index(%q) = %d, want %d", name, got, want)
		}
	}
}
