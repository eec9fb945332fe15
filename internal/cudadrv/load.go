package cudadrv

import (
	"os"
	"sync"
)

// EnvLibrary names an environment variable that, when set, gives the path
// of the driver library to load instead of libcuda.so.1.
const EnvLibrary = "PINMEM_LIBCUDA"

var (
	mu       sync.Mutex
	current  Driver
	curErr   error
	attempts int
)

// Get returns the process's driver, loading and initialising libcuda the
// first time. A failure is remembered: the error matches ErrNoDriver (no
// library, or cuInit failed) or ErrNoDevice (no GPU), and is returned again
// by later calls.
func Get() (Driver, error) {
	mu.Lock()
	defer mu.Unlock()
	if current == nil && curErr == nil {
		attempts++
		current, curErr = Load(LibraryPath())
	}
	return current, curErr
}

// LibraryPath is the library Get loads: $PINMEM_LIBCUDA or libcuda.so.1.
func LibraryPath() string {
	if p := os.Getenv(EnvLibrary); p != "" {
		return p
	}
	return "libcuda.so.1"
}

// Swap installs d as the process's driver (nil forgets any driver, so the
// next Get loads the real library again) and returns a function that puts
// back what was there before. It exists for tests: a fake driver stands in
// for libcuda.
func Swap(d Driver) (restore func()) {
	mu.Lock()
	prev, prevErr := current, curErr
	current, curErr = d, nil
	mu.Unlock()
	return func() {
		mu.Lock()
		current, curErr = prev, prevErr
		mu.Unlock()
	}
}
