package fakedrv

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/pinmem/pinmem/internal/cudadrv"
)

// ErrInstalled is returned by Install while another fake driver is
// installed: the driver is process-wide, so tests that install one must not
// run in parallel with each other.
var ErrInstalled = errors.New("a fake CUDA driver is already installed")

var install struct {
	mu     sync.Mutex
	owners []string // who installed the fakes installed now, innermost last
}

// Install makes d the process's driver (cudadrv.Get returns it) on behalf of
// owner (a test name, shown when an Install is refused) and returns a
// function that puts back the driver that was there before. While a fake is
// installed, only the same owner or one of its subtests (owner "T/sub" under
// "T") may install another over it; anyone else gets an error matching
// ErrInstalled. The owner "" stands for the whole process (a TestMain): any
// test may install over its fake. Restore nested installs in reverse order (t.Cleanup does);
// restore may be called more than once, later calls do nothing.
func Install(d *Driver, owner string) (restore func(), err error) {
	if d == nil {
		return nil, fmt.Errorf("fakedrv: Install of a nil driver: %w", cudadrv.ErrInvalidValue)
	}
	install.mu.Lock()
	defer install.mu.Unlock()
	if n := len(install.owners); n > 0 {
		if top := install.owners[n-1]; top != "" && owner != top && !strings.HasPrefix(owner, top+"/") {
			return nil, fmt.Errorf("fakedrv: %s cannot install a fake driver: %w by %s (tests that install one must not run in parallel)", ownerName(owner), ErrInstalled, ownerName(top))
		}
	}
	install.owners = append(install.owners, owner)
	depth := len(install.owners)
	undo := cudadrv.Swap(d)
	var once sync.Once
	return func() {
		once.Do(func() {
			install.mu.Lock()
			defer install.mu.Unlock()
			undo()
			install.owners = install.owners[:depth-1]
		})
	}, nil
}

func ownerName(owner string) string {
	if owner == "" {
		return "the process (TestMain)"
	}
	return owner
}
