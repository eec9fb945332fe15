package cudadrv

import "runtime"

// Enter locks the calling goroutine to its OS thread and makes ctx current
// there, as every context-dependent driver call requires. The caller must
// call Exit (normally deferred) when done, whether or not Enter failed.
func Enter(d Driver, ctx Context) error {
	runtime.LockOSThread()
	return d.CtxSetCurrent(ctx)
}

// Exit undoes Enter's thread lock. The context stays current on the thread,
// which is harmless: every pinmem call sets its own.
func Exit() { runtime.UnlockOSThread() }

// With runs fn on a locked OS thread with ctx current.
func With(d Driver, ctx Context, fn func() error) error {
	defer Exit()
	if err := Enter(d, ctx); err != nil {
		return err
	}
	return fn()
}
