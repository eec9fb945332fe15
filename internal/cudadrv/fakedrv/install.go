package fakedrv

import (
	"errors"
	"fmt"
	"sync"

	"github.com/pinmem/pinmem/internal/cudadrv"
)

// ErrInstalled is returned by Install while another fake driver is
// installed: the driver is process-wide, so tests that install one must not
// run in parallel with each other.
var ErrInstalled = errors.New("a fake CUDA driver is already installed")

var install struct {
	mu    sync.Mutex
	owner string // who installed the fake now installed; "" when none is
}

// Install makes d the process's driver (cudadrv.Get returns it) on behalf of
// owner (a test name, shown when a second Install is refused) and returns a
// function that puts back the driver that was there before. It fails with an
// error matching ErrInstalled while a fake installed earlier has not been
// restored. restore may be called more than once; later calls do nothing.
func Install(d *Driver, owner string) (restore func(), err error) {
	if d == nil {
		return nil, fmt.Errorf("fakedrv: Install of a nil driver: %w", cudadrv.ErrInvalidValue)
	}
	install.mu.Lock()
	defer install.mu.Unlock()
	if install.owner != "" {
		return nil, fmt.Errorf("fakedrv: %s cannot install a fake driver: %w by %s (tests that install one must not run in parallel)", owner, ErrInstalled, install.owner)
	}
	install.owner = owner
	undo := cudadrv.Swap(d)
	var once sync.Once
	return func() {
		once.Do(func() {
			install.mu.Lock()
			defer install.mu.Unlock()
			undo()
			install.owner = ""
		})
	}, nil
}
