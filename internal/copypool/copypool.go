// Package copypool copies memory in parallel on a persistent set of
// goroutines: the CPU copies between Go memory and pinned staging buffers,
// where one goroutine reaches a fraction of the memory bandwidth.
package copypool

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinmem/pinmem/internal/cpuclock"
)

// MinPiece is the smallest share of a copy given to one goroutine; smaller
// copies use fewer goroutines.
const MinPiece = 256 << 10

// spinWait is how long a worker looks for its next batch, and a copy's
// caller polls for the workers' pieces, before parking: a staged
// transfer's batches come tens of microseconds apart, and waking parked
// threads would cost as much per batch.
const spinWait = 50 * time.Microsecond

// Pool is a set of copy goroutines. A copy is a batch of sub-pieces that
// its caller and the workers it enlists claim one at a time, so that a
// goroutine that runs late holds the copy up by one sub-piece, not by a
// whole share.
type Pool struct {
	mu      sync.Mutex
	workers int
	started atomic.Int32 // workers, read by Copy without the lock
	closed  bool
	tasks   chan *batch // one entry per worker a batch enlists
	wg      sync.WaitGroup
	measure bool // time the pieces
	thread  bool // in thread CPU time (the copying goroutines locked to their threads)
	once    sync.Once
	spin    atomic.Int64 // nanoseconds: spinWait (tests vary it)
}

// batch is one parallel copy of src into dst, in sub-pieces of size bytes
// (the last one shorter).
type batch struct {
	dst, src []byte
	size     int
	pieces   int32
	next     atomic.Int32 // the next sub-piece to claim
	left     atomic.Int32 // sub-pieces not yet copied
	wg       sync.WaitGroup
	cpu      atomic.Int64 // nanoseconds of CPU (wall time without thread CPU) spent copying
}

// New starts a pool of workers goroutines. With measure, Copy returns the
// CPU time of its pieces (thread CPU time where cpuclock has it, with the
// copying goroutines locked to their threads; wall time otherwise);
// without it copies make no system call.
func New(workers int, measure bool) *Pool {
	p := &Pool{tasks: make(chan *batch, 4*max(workers+1, runtime.NumCPU())), measure: measure, thread: measure && cpuclock.HaveThread}
	p.spin.Store(int64(spinWait))
	p.Grow(workers)
	return p
}

// Grow starts workers until there are at least n.
func (p *Pool) Grow(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ; !p.closed && p.workers < n; p.workers++ {
		p.wg.Go(p.worker)
	}
	p.started.Store(int32(p.workers))
}

// worker copies the batches it is handed until the pool closes.
func (p *Pool) worker() {
	if p.thread {
		runtime.LockOSThread() // until the goroutine exits, ending the thread
	}
	for {
		var b *batch
		var ok bool
		if !p.poll(func() bool {
			select {
			case b, ok = <-p.tasks:
				return true
			default:
				return false
			}
		}) {
			b, ok = <-p.tasks
		}
		if !ok {
			return // closed and drained
		}
		b.work(p)
	}
}

// poll calls done, yielding the processor between calls, until it
// reports true (poll too) or the pool's spin time has passed.
func (p *Pool) poll(done func() bool) bool {
	spin := time.Duration(p.spin.Load())
	if spin <= 0 {
		return false
	}
	var start time.Time
	for i := 0; ; i++ {
		if done() {
			return true
		}
		if i == 0 {
			start = time.Now()
		} else if i%64 == 0 && time.Since(start) > spin {
			return false
		}
		runtime.Gosched()
	}
}

// epoch makes wall time a clock like thread CPU time.
var epoch = time.Now()

// clock reads the calling thread's CPU time, or the wall time.
func (p *Pool) clock() time.Duration {
	if p.thread {
		return cpuclock.Thread()
	}
	return time.Since(epoch)
}

// work claims and copies sub-pieces of b until none is left and, when p
// measures, adds the time it took to the batch before it counts its
// sub-pieces done (Copy reads it once they are). A worker that comes to a
// batch already done returns without touching its memory.
func (b *batch) work(p *Pool) {
	var c0 time.Duration
	if p.measure {
		c0 = p.clock()
	}
	done := 0
	for i := int(b.next.Add(1) - 1); i < int(b.pieces); i = int(b.next.Add(1) - 1) {
		lo := i * b.size
		hi := min(lo+b.size, len(b.dst))
		copy(b.dst[lo:hi], b.src[lo:hi])
		done++
	}
	if done == 0 {
		return
	}
	if p.measure {
		b.cpu.Add(int64(p.clock() - c0))
	}
	b.left.Add(int32(-done))
	b.wg.Add(-done)
}

// Copy copies src into dst over up to parts goroutines, the caller
// included, with sub sub-pieces per goroutine of at least MinPiece bytes,
// and returns the CPU time it took summed over the goroutines (zero when
// the pool does not measure). It copies min(len(dst), len(src)) bytes.
func (p *Pool) Copy(parts, sub int, dst, src []byte) time.Duration {
	if b := p.run(parts, sub, dst, src); b != nil {
		return time.Duration(b.cpu.Load())
	}
	return 0
}

// run is Copy: it enlists up to parts-1 workers without blocking, copies
// sub-pieces itself and returns once every sub-piece is copied (nil when
// there is nothing to copy).
func (p *Pool) run(parts, sub int, dst, src []byte) *batch {
	n := min(len(dst), len(src))
	if n == 0 {
		return nil
	}
	b := &batch{dst: dst[:n], src: src[:n]}
	helpers := min(parts, n/MinPiece) - 1
	pieces := 1
	if helpers > 0 {
		pieces = min((helpers+1)*max(sub, 1), n/MinPiece)
	}
	b.size = (n/pieces + 4095) &^ 4095
	b.pieces = int32((n + b.size - 1) / b.size)
	b.left.Store(b.pieces)
	b.wg.Add(int(b.pieces))
enlist:
	for range min(helpers, int(p.started.Load())) {
		select {
		case p.tasks <- b:
		default: // queue full: the caller copies the rest
			break enlist
		}
	}
	if p.thread {
		runtime.LockOSThread()
	}
	b.work(p)
	if p.thread {
		runtime.UnlockOSThread()
	}
	p.poll(func() bool { return b.left.Load() == 0 })
	b.wg.Wait()
	return b
}

// Close stops the workers and waits for them to exit.
func (p *Pool) Close() {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(p.tasks)
		p.wg.Wait()
	})
}
