// Package expvars publishes pinmem's ledger and pools' statistics with the
// standard library's expvar package, so that they appear as JSON under
// /debug/vars.
//
// It is a package of its own because importing expvar registers the
// /debug/vars handler on http.DefaultServeMux and links net/http into the
// program: importing pinmem alone has no such side effect. Nothing is
// published until Publish or PublishPool is called.
//
//	if err := expvars.Publish(""); err != nil { // "pinmem"
//		return err
//	}
package expvars

import (
	"expvar"
	"fmt"
	"sync"
	"weak"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/pool"
)

// DefaultName is the expvar name Publish uses for an empty name.
const DefaultName = "pinmem"

// DefaultPoolName is the expvar name PublishPool uses for an empty name.
const DefaultPoolName = "pinmem.pool"

// mu serializes the check for a name and its publication: expvar.Publish
// panics on a name that is taken.
var mu sync.Mutex

// publish publishes v under name or returns an error matching
// cuda.ErrInvalidValue when the name is taken.
func publish(name string, v expvar.Var) (err error) {
	mu.Lock()
	defer mu.Unlock()
	if expvar.Get(name) != nil {
		return fmt.Errorf("expvars: %q is already published: %w", name, cuda.ErrInvalidValue)
	}
	defer func() {
		// Other code published the name between the check and the call
		// (expvar.Publish panics then).
		if r := recover(); r != nil {
			err = fmt.Errorf("expvars: publishing %q: %v: %w", name, r, cuda.ErrInvalidValue)
		}
	}()
	expvar.Publish(name, v)
	return nil
}

// Publish publishes pinmem.Stats (the ledger of pinned memory, the budget
// and the counts of owners dropped without Close) under name, DefaultName
// when name is empty. The value is computed at each read. A name that is
// already published, by this package or other code, is an error matching
// cuda.ErrInvalidValue (expvar itself would panic); expvar cannot withdraw
// a variable, so a name stays taken for the life of the process.
func Publish(name string) error {
	if name == "" {
		name = DefaultName
	}
	return publish(name, expvar.Func(func() any { return pinmem.Stats() }))
}

// PublishPool publishes p.Stats under name, DefaultPoolName when name is
// empty. The variable does not keep p reachable: once p has been garbage
// collected it reads as null. A nil p, or a name already published, is an
// error matching cuda.ErrInvalidValue. Pool names need not be unique; the
// expvar names must be.
func PublishPool(name string, p *pool.Pool) error {
	if p == nil {
		return fmt.Errorf("expvars: PublishPool of a nil pool: %w", cuda.ErrInvalidValue)
	}
	if name == "" {
		name = DefaultPoolName
	}
	w := weak.Make(p)
	return publish(name, expvar.Func(func() any {
		if q := w.Value(); q != nil {
			return q.Stats()
		}
		return nil
	}))
}
