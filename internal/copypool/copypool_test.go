package copypool

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestPoolSpin: the copy pool copies every byte whether its workers
// park at once or spin for the next piece, copies that arrive while they
// spin and after they parked alike, and close ends spinning workers.
func TestPoolSpin(t *testing.T) {
	for _, spin := range []time.Duration{0, 50 * time.Microsecond, 5 * time.Millisecond} {
		p := New(3, false)
		p.spin.Store(int64(spin))
		for i, gap := range []time.Duration{0, 0, time.Millisecond, 10 * time.Millisecond, 0} {
			time.Sleep(gap)
			n := 4<<20 + 4096*i + 7
			src := testutil.RandomBytes(n, uint64(i+1))
			dst := make([]byte, n)
			p.Copy(4, 4, dst, src)
			if !bytes.Equal(dst, src) {
				t.Fatalf("spin %v, copy %d: bytes differ", spin, i)
			}
		}
		done := make(chan struct{})
		go func() { p.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("spin %v: close did not return", spin)
		}
	}
}

// TestPoolBatches: copies of many sizes (below one piece, odd, many
// sub-pieces) from several goroutines at once, with one share per
// goroutine and with several sub-pieces each, copy every byte, and a pool
// with fewer workers than a copy asks for still finishes every copy.
func TestPoolBatches(t *testing.T) {
	for _, sub := range []int{1, 4} {
		for _, workers := range []int{2, 8} {
			p := New(workers-1, false)
			var wg sync.WaitGroup
			errs := make(chan string, 8)
			for g := range 8 {
				wg.Go(func() {
					for i, n := range []int{1, 4095, MinPiece - 1, MinPiece + 1, 3*MinPiece + 17, 16<<20 + 4097} {
						src := testutil.RandomBytes(n, uint64(g*16+i+1))
						dst := make([]byte, n+1)
						dst[n] = 0xA5
						p.Copy(12, sub, dst[:n], src)
						if !bytes.Equal(dst[:n], src) || dst[n] != 0xA5 {
							errs <- fmt.Sprintf("sub %d, %d workers, goroutine %d: copy of %d bytes wrong", sub, workers, g, n)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for e := range errs {
				t.Error(e)
			}
			p.Close()
		}
	}
}

// TestPoolCPUCounted: with measure on, a copy's CPU time is complete
// when Copy returns: no worker adds its share afterwards (a worker adds
// it before it counts its sub-pieces done), and a pool asked for more
// goroutines than it has still copies everything.
func TestPoolCPUCounted(t *testing.T) {
	p := New(7, true)
	defer p.Close()
	src := testutil.RandomBytes(16<<20, 9)
	dst := make([]byte, len(src))
	for i := range 200 {
		b := p.run(32, 4, dst, src)
		got := b.cpu.Load()
		time.Sleep(200 * time.Microsecond)
		if late := b.cpu.Load(); late != got {
			t.Fatalf("copy %d: %v of CPU time when Copy returned, %v later", i, time.Duration(got), time.Duration(late))
		}
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("bytes differ")
	}
}
