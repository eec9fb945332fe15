package transfer

import (
	"bytes"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/testutil"
)

// TestCopyPoolSpin: the copy pool copies every byte whether its workers
// park at once or spin for the next piece, copies that arrive while they
// spin and after they parked alike, and close ends spinning workers.
func TestCopyPoolSpin(t *testing.T) {
	defer func(s int64) { spinWait.Store(s) }(spinWait.Load())
	for _, spin := range []time.Duration{0, 50 * time.Microsecond, 5 * time.Millisecond} {
		spinWait.Store(int64(spin))
		p := newCopyPool(4, false)
		for i, gap := range []time.Duration{0, 0, time.Millisecond, 10 * time.Millisecond, 0} {
			time.Sleep(gap)
			n := 4<<20 + 4096*i + 7
			src := testutil.RandomBytes(n, uint64(i+1))
			dst := make([]byte, n)
			p.copy(dst, src)
			if !bytes.Equal(dst, src) {
				t.Fatalf("spin %v, copy %d: bytes differ", spin, i)
			}
		}
		done := make(chan struct{})
		go func() { p.close(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("spin %v: close did not return", spin)
		}
	}
}
