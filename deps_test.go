package pinmem

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoImportSideEffects checks that the package links neither expvar
// (which registers /debug/vars on http.DefaultServeMux) nor net/http:
// publication is package expvars' job, on request.
func TestNoImportSideEffects(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "expvar" || p == "net/http" {
			t.Errorf("package pinmem depends on %s", p)
		}
	}
}
