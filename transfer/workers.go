package transfer

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// copyPool is a persistent set of goroutines that copy memory in parallel.
// A copy is a batch of sub-pieces that its caller and the workers it
// enlists claim one at a time until none is left, so that a goroutine
// that runs late (its thread preempted, say) holds up the copy by one
// sub-piece, not by a whole share of it.
type copyPool struct {
	n       int // goroutines per copy, the caller included (copy; copyN takes its own)
	mu      sync.Mutex
	workers int
	started atomic.Int32 // workers, for copyN without the lock
	closed  bool
	tasks   chan *copyBatch // one entry per worker a batch enlists
	wg      sync.WaitGroup
	measure bool // measure the CPU time of the pieces (WithStats)
	thread  bool // measure thread CPU time (workers are locked to their threads)
	once    sync.Once
	spin    atomic.Int64 // nanoseconds: spinWait (tests vary it)
}

// copyBatch is one parallel copy of src into dst, in sub-pieces of size
// bytes (the last one shorter).
type copyBatch struct {
	dst, src []byte
	size     int
	pieces   int32
	next     atomic.Int32 // the next sub-piece to claim
	left     atomic.Int32 // sub-pieces not yet copied
	wg       sync.WaitGroup
	cpu      atomic.Int64 // nanoseconds of CPU (or wall time without thread CPU) spent copying
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
// once. Each pool holds it (copyPool.spin), so that a test can vary it.
const spinWait = 50 * time.Microsecond

// newCopyPool starts n-1 workers (the caller of copy is the n-th). With
// measure, pieces are timed: thread CPU time where available (the workers
// and the caller are then locked to their OS threads), wall time
// otherwise; without it, copies make no system call.
func newCopyPool(n int, measure bool) *copyPool {
	p := &copyPool{n: n, tasks: make(chan *copyBatch, 4*max(n, runtime.NumCPU())), measure: measure, thread: measure && haveThreadCPU}
	p.spin.Store(int64(spinWait))
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
	p.started.Store(int32(p.workers))
}

func (p *copyPool) worker() {
	defer p.wg.Done()
	if p.thread {
		// Locked so that getrusage(RUSAGE_THREAD) measures this goroutine
		// alone. The goroutine exits when the pool closes, ending the thread.
		runtime.LockOSThread()
	}
	for {
		b, ok := p.next()
		if !ok {
			return
		}
		b.work(p)
	}
}

// next returns the next batch to help with, looking for one for up to
// spinWait before blocking; ok is false once the pool is closed and
// drained.
func (p *copyPool) next() (b *copyBatch, ok bool) {
	if spin := time.Duration(p.spin.Load()); spin > 0 {
		var start time.Time
		for i := 0; ; i++ {
			select {
			case b, ok = <-p.tasks:
				return b, ok
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
	b, ok = <-p.tasks
	return b, ok
}

// work claims and copies sub-pieces of b until none is left and, when p
// measures, adds the CPU time it took to the batch before it counts its
// sub-pieces done (so that copyN, which returns once they are, reads all
// of it). A worker that comes to a batch already done returns at once
// without touching its memory.
func (b *copyBatch) work(p *copyPool) {
	var t0 time.Time
	var c0 time.Duration
	if p.measure {
		if p.thread {
			c0 = threadCPU()
		} else {
			t0 = time.Now()
		}
	}
	done := 0
	for {
		i := int(b.next.Add(1) - 1)
		if i >= int(b.pieces) {
			break
		}
		lo := i * b.size
		hi := min(lo+b.size, len(b.dst))
		copy(b.dst[lo:hi], b.src[lo:hi])
		done++
	}
	if done == 0 {
		return
	}
	if p.measure {
		if p.thread {
			b.cpu.Add(int64(threadCPU() - c0))
		} else {
			b.cpu.Add(int64(time.Since(t0)))
		}
	}
	b.left.Add(int32(-done))
	b.wg.Add(-done)
}

// copy copies src into dst (of the same length) using up to p.n goroutines
// and returns the CPU time the copy took, summed over the goroutines
// (zero when the pool does not measure).
func (p *copyPool) copy(dst, src []byte) time.Duration {
	return p.copyN(p.n, defaultTuning().subPieces, dst, src)
}

// copyN is copy split over up to parts goroutines (the caller included),
// sub sub-pieces per goroutine,
// each share at least minPiece bytes: the caller enlists up to parts-1 of
// the pool's workers (no more than it has, in the order copies ask),
// copies sub-pieces itself, and waits for those the workers claimed.
func (p *copyPool) copyN(parts, sub int, dst, src []byte) time.Duration {
	b := p.batch(parts, sub, dst, src)
	if b == nil {
		return 0
	}
	return time.Duration(b.cpu.Load())
}

// batch runs copyN's copy and returns its batch, every sub-piece copied
// and its CPU time added (nil when there is nothing to copy).
func (p *copyPool) batch(parts, sub int, dst, src []byte) *copyBatch {
	n := min(len(dst), len(src))
	if n == 0 {
		return nil
	}
	b := &copyBatch{dst: dst[:n], src: src[:n]}
	helpers := min(parts, n/minPiece) - 1
	pieces := 1
	if helpers > 0 {
		pieces = min((helpers+1)*max(sub, 1), n/minPiece)
	}
	b.size = (n/pieces + 4095) &^ 4095
	b.pieces = int32((n + b.size - 1) / b.size)
	b.left.Store(b.pieces)
	b.wg.Add(int(b.pieces))
	// Enlist at most as many workers as the pool has, without blocking:
	// when the queue is full the caller copies the rest itself.
	helpers = min(helpers, int(p.started.Load()))
enlist:
	for range helpers {
		select {
		case p.tasks <- b:
		default:
			break enlist
		}
	}
	p.callerWork(b)
	if spin := time.Duration(p.spin.Load()); spin > 0 && b.left.Load() > 0 {
		start := time.Now()
		for i := 1; b.left.Load() > 0; i++ {
			if i%64 == 0 && time.Since(start) > spin {
				break
			}
			runtime.Gosched()
		}
	}
	b.wg.Wait()
	return b
}

func (p *copyPool) callerWork(b *copyBatch) {
	if p.thread {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	b.work(p)
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
