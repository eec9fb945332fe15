package fakedrv

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/pinmem/pinmem/internal/cudadrv"
)

// ErrInstalled is matched by the error Install returns while another fake
// driver is installed: the driver is process-wide, so tests that install
// one must not run in parallel with each other.
var ErrInstalled = errors.New("a fake CUDA driver is already installed")

// InstalledError is the error Install returns when it refuses an install.
// It matches ErrInstalled.
type InstalledError struct {
	Owner string // who asked to install ("" for the process)
	By    string // who installed the fake that is installed ("" for the process)
}

func (e *InstalledError) Error() string {
	return fmt.Sprintf("cudatest: %s cannot install a fake driver: one is already installed by %s (tests that install one must not run in parallel)", OwnerName(e.Owner), OwnerName(e.By))
}

// Is reports whether target is ErrInstalled.
func (e *InstalledError) Is(target error) bool { return target == ErrInstalled }

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
		return nil, fmt.Errorf("cudatest: Install of a nil driver: %w", cudadrv.ErrInvalidValue)
	}
	install.mu.Lock()
	defer install.mu.Unlock()
	if n := len(install.owners); n > 0 {
		if top := install.owners[n-1]; top != "" && owner != top && !strings.HasPrefix(owner, top+"/") {
			return nil, &InstalledError{Owner: owner, By: top}
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

// OwnerName is how messages name an owner of Install: the test's name, or
// "the process (TestMain)" for "".
func OwnerName(owner string) string {
	if owner == "" {
		return "the process (TestMain)"
	}
	return owner
}
