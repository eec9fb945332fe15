package lifecycle

import "sync"

// Gate counts the work in progress of an owner; Idle is closed once the
// owner is closed and no work is left.
type Gate struct {
	mu     sync.Mutex
	closed bool
	active int
	idle   chan struct{}
	err    error // Begin's error once closed
}

// NewGate returns an open gate whose Begin fails with errClosed (an
// owner's ErrClosed) once it is closed.
func NewGate(errClosed error) *Gate {
	return &Gate{idle: make(chan struct{}), err: errClosed}
}

// MarkClosed closes the owner to new work; false if it already was.
func (g *Gate) MarkClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.closed = true
	if g.active == 0 {
		close(g.idle)
	}
	return true
}

// IsClosed reports whether the owner is closed.
func (g *Gate) IsClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// Begin registers work in progress, or fails with the gate's ErrClosed
// after MarkClosed.
func (g *Gate) Begin() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return g.err
	}
	g.active++
	return nil
}

// End ends what Begin (or Hold) registered.
func (g *Gate) End() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active--; g.active == 0 && g.closed {
		close(g.idle)
	}
}

// Hold registers one more piece of work, closed or not, for a caller that
// already holds one (a drain taking over from its call).
func (g *Gate) Hold() {
	g.mu.Lock()
	g.active++
	g.mu.Unlock()
}

// Idle is closed once the owner is closed and no work is left.
func (g *Gate) Idle() <-chan struct{} { return g.idle }

// ErrClosed is the error Begin returns once the gate is closed.
func (g *Gate) ErrClosed() error { return g.err }

// Active returns the number of pieces of work in progress.
func (g *Gate) Active() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.active
}
