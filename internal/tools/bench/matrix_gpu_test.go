package bench

import (
	"bytes"
	"testing"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestGPUMatrix runs the host<->GPU matrix on every device present: each
// device alone, then all at once, every result verified.
func TestGPUMatrix(t *testing.T) {
	testutil.RequireGPU(t)
	var progress bytes.Buffer
	rs, m, err := Matrix(t.Context(), MatrixConfig{Size: 64 << 20, Samples: 3, Session: SessionConfig{Progress: &progress}})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteMatrix(&b, m, rs); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", b.String())
	for _, r := range rs {
		if r.Skipped || !r.Verified || r.Median <= 0 {
			t.Errorf("%v", r)
		}
	}
}
