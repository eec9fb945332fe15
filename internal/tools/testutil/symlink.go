package testutil

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// FlipSymlink makes link a symbolic link to targets[0] and starts a
// goroutine that keeps replacing it, atomically (a new link renamed over
// it), by a link to the next target in turn, so that a test can open link
// while what it names changes. It skips the test where symbolic links
// cannot be made. The returned stop ends the goroutine and waits for it.
func FlipSymlink(t testing.TB, link string, targets ...string) (stop func()) {
	t.Helper()
	if err := os.Symlink(targets[0], link); err != nil {
		t.Skipf("symbolic links: %v", err)
	}
	done := make(chan struct{})
	var flips sync.WaitGroup
	flips.Go(func() {
		tmp := filepath.Join(filepath.Dir(link), filepath.Base(link)+".next")
		for i := 1; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			_ = os.Remove(tmp)
			if err := os.Symlink(targets[i%len(targets)], tmp); err != nil {
				t.Error(err)
				return
			}
			if err := os.Rename(tmp, link); err != nil {
				t.Error(err)
				return
			}
		}
	})
	return func() { close(done); flips.Wait() }
}
