package transfer

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// copyPool is a persistent set of goroutines that copy memory in parallel.
// A copy is a batch of sub-pieces that its caller and the workers it
// enlists claim one at a time, so that a goroutine that runs late holds
// the copy up by one sub-piece, not by a whole share.
type copyPool struct {
	n       int // goroutines per copy, the caller included (copy; copyN takes its own)
	mu      sync.Mutex
	workers int
	started atomic.Int32 // workers, for copyN without the lock
	closed  bool
	tasks   chan *copyBatch // one entry per worker a batch enlists
	wg      sync.WaitGroup
	measure bool // measure the CPU time of the pieces (WithStats)
	thread  bool // in thread CPU time (the copying goroutines locked to their threads)
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
	cpu      atomic.Int64 // nanoseconds of CPU (wall time without thread CPU) spent copying
}

// spinWait is how long a worker looks for its next batch, and a copy's
// caller polls for the workers' pieces, before parking: a staged
// transfer's batches come tens of microseconds apart, and waking parked
// threads would cost as much per batch.
const spinWait = 50 * time.Microsecond

// newCopyPool starts n-1 workers (the caller of copy is the n-th); with
// measure, copies are timed (see clock), else they make no system call.
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

// worker copies the batches it is handed until the pool closes.
func (p *copyPool) worker() {
	defer p.wg.Done()
	if p.thread {
		runtime.LockOSThread() // until the goroutine exits, ending the thread
	}
	for {
		var b *copyBatch
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
func (p *copyPool) poll(done func() bool) bool {
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

// clock reads the calling thread's CPU time, or the wall time without
// thread CPU time.
func (p *copyPool) clock() time.Duration {
	if p.thread {
		return threadCPU()
	}
	return time.Since(epoch)
}

// work claims and copies sub-pieces of b until none is left and, when p
// measures, adds the time it took to the batch before it counts its
// sub-pieces done (copyN reads it once they are). A worker that comes to
// a batch already done returns without touching its memory.
func (b *copyBatch) work(p *copyPool) {
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

// copy copies src into dst (of the same length) using up to p.n goroutines
// and returns the CPU time the copy took, summed over the goroutines
// (zero when the pool does not measure).
func (p *copyPool) copy(dst, src []byte) time.Duration {
	return p.copyN(p.n, defaultTuning().subPieces, dst, src)
}

// copyN is copy over up to parts goroutines (the caller included), sub
// sub-pieces per goroutine of at least minPiece bytes.
func (p *copyPool) copyN(parts, sub int, dst, src []byte) time.Duration {
	if b := p.batch(parts, sub, dst, src); b != nil {
		return time.Duration(b.cpu.Load())
	}
	return 0
}

// batch runs copyN's copy: it enlists up to parts-1 idle workers without
// blocking, copies sub-pieces itself and returns once every sub-piece is
// copied (nil when there is nothing to copy).
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
