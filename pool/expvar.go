package pool

import (
	"expvar"
	"fmt"
	"sync"

	"github.com/pinmem/pinmem/cuda"
)

// ExpvarPrefix starts the expvar name of every pool's Stats.
const ExpvarPrefix = "pinmem.pool."

var (
	regMu     sync.Mutex
	registry  = map[string]*Pool{}
	published = map[string]bool{}
)

// register claims p's name and publishes its stats (once per name: expvar
// cannot withdraw a variable, so a closed pool's name shows null until a
// new pool takes it).
func register(p *Pool) error {
	regMu.Lock()
	defer regMu.Unlock()
	name := p.name
	if registry[name] != nil {
		return fmt.Errorf("pool: name %q is used by an open pool: %w", name, cuda.ErrInvalidValue)
	}
	if !published[name] {
		if expvar.Get(ExpvarPrefix+name) != nil {
			return fmt.Errorf("pool: expvar %q is already published by other code: %w", ExpvarPrefix+name, cuda.ErrInvalidValue)
		}
		expvar.Publish(ExpvarPrefix+name, expvar.Func(func() any {
			regMu.Lock()
			q := registry[name]
			regMu.Unlock()
			if q == nil {
				return nil
			}
			return q.Stats()
		}))
		published[name] = true
	}
	registry[name] = p
	return nil
}

func unregister(p *Pool) {
	regMu.Lock()
	if registry[p.name] == p {
		delete(registry, p.name)
	}
	regMu.Unlock()
}
