package cudadrv

import "runtime"

// Scope is what one Enter changed on the calling OS thread: its own thread
// lock and, when it switched contexts, the context that was current before.
// The zero Scope changed nothing, and its Exit does nothing.
type Scope struct {
	d       Driver
	prev    Context
	swapped bool
	locked  bool
}

// Enter locks the calling goroutine to its OS thread and makes ctx current
// there, as every context-dependent driver call requires. The caller must
// call Exit on the returned Scope (normally deferred) whether or not Enter
// failed. Exit puts back the context that was current before, so that code
// of other libraries (TensorRT, ONNX Runtime, cgo) on a thread the caller
// locked itself finds its own context afterwards, and it releases only
// Enter's own lock: thread locks nest, so a LockOSThread of the caller
// stays in force.
func Enter(d Driver, ctx Context) (Scope, error) {
	runtime.LockOSThread()
	sc := Scope{d: d, locked: true}
	prev, err := d.CtxGetCurrent()
	if err != nil {
		return sc, err
	}
	if prev == ctx {
		return sc, nil
	}
	if err := d.CtxSetCurrent(ctx); err != nil {
		return sc, err
	}
	sc.prev, sc.swapped = prev, true
	return sc, nil
}

// Exit undoes Enter: it makes the previous context current again (a
// failure to do so, for a context destroyed meanwhile, leaves the thread
// with none of pinmem's contexts to undo and is ignored) and releases
// Enter's thread lock.
func (sc Scope) Exit() {
	if sc.swapped {
		_ = sc.d.CtxSetCurrent(sc.prev)
	}
	if sc.locked {
		runtime.UnlockOSThread()
	}
}

// With runs fn on a locked OS thread with ctx current, and restores the
// thread's previous context afterwards (see Enter).
func With(d Driver, ctx Context, fn func() error) error {
	sc, err := Enter(d, ctx)
	defer sc.Exit()
	if err != nil {
		return err
	}
	return fn()
}
