// Package freehook lets a package that holds a registration of a pinmem
// buffer (package remote's transport registrations) be told before the
// buffer is freed, and refuse the free while the memory is in use. pinmem's
// Buffer.Free runs the hooks of the buffer's base address first.
package freehook

import (
	"errors"
	"sync"
)

var (
	mu    sync.Mutex
	next  uint64
	hooks = map[uintptr]map[uint64]func() error{}
)

// Add runs f before the buffer at base is freed. f returns nil once it has
// dropped what it holds of the buffer (the free goes on), or an error to
// refuse the free. remove undoes Add; f is not called after it returned.
func Add(base uintptr, f func() error) (remove func()) {
	mu.Lock()
	defer mu.Unlock()
	next++
	id := next
	if hooks[base] == nil {
		hooks[base] = map[uint64]func() error{}
	}
	hooks[base][id] = f
	return func() {
		mu.Lock()
		defer mu.Unlock()
		delete(hooks[base], id)
		if len(hooks[base]) == 0 {
			delete(hooks, base)
		}
	}
}

// Run calls the hooks of base (without the package's lock: a hook removes
// itself) and returns their errors joined; a hook that succeeded is not
// called again.
func Run(base uintptr) error {
	mu.Lock()
	fs := make([]func() error, 0, len(hooks[base]))
	for _, f := range hooks[base] {
		fs = append(fs, f)
	}
	mu.Unlock()
	var errs []error
	for _, f := range fs {
		if err := f(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
