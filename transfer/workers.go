package transfer

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// copyPool is a persistent set of goroutines that copy memory in parallel.
// A copy is split into pieces; the calling goroutine copies the first piece
// itself and the workers the rest.
type copyPool struct {
	n       int // goroutines per copy, the caller included (copy; copyN takes its own)
	mu      sync.Mutex
	workers int
	closed  bool
	tasks   chan copyTask
	wg      sync.WaitGroup
	measure bool // measure the CPU time of the pieces (WithStats)
	thread  bool // measure thread CPU time (workers are locked to their threads)
	once    sync.Once
}

type copyTask struct {
	dst, src []byte
	b        *copyBatch
}

type copyBatch struct {
	wg   sync.WaitGroup
	left atomic.Int32 // pieces queued and not yet copied
	cpu  atomic.Int64 // nanoseconds of CPU (or wall time without thread CPU) spent copying
}

// spinWait is how long a copy worker that finished a piece looks for the
// next one before it parks, and how long the caller of a copy waits for
// the workers' pieces by polling before it parks. A staged transfer hands
// its copy goroutines a batch of pieces per stage, a few tens of
// microseconds apart; a parked goroutine's OS thread sleeps, and waking
// a dozen sleeping threads (on a virtual machine, their halted virtual
// CPUs) costs tens of microseconds per batch, which a short spin avoids.
// The spin ends at once when there is work; its cost is at most this
// much CPU per worker after the last batch of a transfer. 0 parks at
// once. Nanoseconds, atomic so that a GPU benchmark can compare settings
// while the workers run.
var spinWait atomic.Int64

func init() { spinWait.Store(int64(50 * time.Microsecond)) }

// newCopyPool starts n-1 workers (the caller of copy is the n-th). With
// measure, pieces are timed: thread CPU time where available (the workers
// and the caller are then locked to their OS threads), wall time
// otherwise; without it, copies make no system call.
func newCopyPool(n int, measure bool) *copyPool {
	p := &copyPool{n: n, tasks: make(chan copyTask, 4*max(n, runtime.NumCPU())), measure: measure, thread: measure && haveThreadCPU}
	p.grow(n - 1)
	return p
}

// grow starts workers until there are at least n.
func (p *copyPool) grow(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ; !p.closed && p.workers < n; p.workers++ {
		p.wg.Add(1)
		go p.worker()
	}
}

func (p *copyPool) worker() {
	defer p.wg.Done()
	if p.thread {
		// Locked so that getrusage(RUSAGE_THREAD) measures this goroutine
		// alone. The goroutine exits when the pool closes, ending the thread.
		runtime.LockOSThread()
	}
	for {
		t, ok := p.next()
		if !ok {
			return
		}
		t.b.piece(t.dst, t.src, p)
		t.b.left.Add(-1)
		t.b.wg.Done()
	}
}

// next returns the next task, looking for one for up to spinWait before
// blocking; ok is false once the pool is closed and drained.
func (p *copyPool) next() (t copyTask, ok bool) {
	if spin := time.Duration(spinWait.Load()); spin > 0 {
		var start time.Time
		for i := 0; ; i++ {
			select {
			case t, ok = <-p.tasks:
				return t, ok
			default:
			}
			if i == 0 {
				start = time.Now()
			} else if i%64 == 0 && time.Since(start) > spin {
				break
			}
			runtime.Gosched()
		}
	}
	t, ok = <-p.tasks
	return t, ok
}

// piece copies src into dst and, when p measures, adds the CPU time it
// took to the batch.
func (b *copyBatch) piece(dst, src []byte, p *copyPool) {
	if !p.measure {
		copy(dst, src)
		return
	}
	if p.thread {
		t0 := threadCPU()
		copy(dst, src)
		b.cpu.Add(int64(threadCPU() - t0))
		return
	}
	t0 := time.Now()
	copy(dst, src)
	b.cpu.Add(int64(time.Since(t0)))
}

// copy copies src into dst (of the same length) using up to p.n goroutines
// and returns the CPU time the copy took, summed over the goroutines
// (zero when the pool does not measure).
func (p *copyPool) copy(dst, src []byte) time.Duration { return p.copyN(p.n, dst, src) }

// copyN is copy split over up to parts goroutines (the caller included);
// the pieces queue for the pool's workers, however many there are.
func (p *copyPool) copyN(parts int, dst, src []byte) time.Duration {
	n := min(len(dst), len(src))
	if n == 0 {
		return 0
	}
	dst, src = dst[:n], src[:n]
	pieces := min(parts, n/minPiece)
	var b copyBatch
	if pieces <= 1 {
		p.callerPiece(&b, dst, src)
		return time.Duration(b.cpu.Load())
	}
	size := (n/pieces + 4095) &^ 4095
	for off := size; off < n; off += size {
		end := min(off+size, n)
		b.wg.Add(1)
		b.left.Add(1)
		p.tasks <- copyTask{dst[off:end], src[off:end], &b}
	}
	p.callerPiece(&b, dst[:size], src[:size])
	if spin := time.Duration(spinWait.Load()); spin > 0 && b.left.Load() > 0 {
		start := time.Now()
		for i := 1; b.left.Load() > 0; i++ {
			if i%64 == 0 && time.Since(start) > spin {
				break
			}
			runtime.Gosched()
		}
	}
	b.wg.Wait()
	return time.Duration(b.cpu.Load())
}

func (p *copyPool) callerPiece(b *copyBatch, dst, src []byte) {
	if p.thread {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	b.piece(dst, src, p)
}

// close stops the workers and waits for them to exit.
func (p *copyPool) close() {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(p.tasks)
		p.wg.Wait()
	})
}
