package cudadrv

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// EnvLibrary names an environment variable that, when set, gives the path
// of the driver library to load instead of libcuda.so.1. It must name a
// regular file (a FIFO, device or directory is refused with a *LoadError,
// so that a mistyped path cannot hang the loader), and it is ignored in a
// process that runs with privileges its invoker lacks (setuid, setgid or
// file capabilities: the kernel's AT_SECURE), where it would let the
// invoker run code of their choosing with those privileges.
const EnvLibrary = "PINMEM_LIBCUDA"

// defaultLibrary is the driver's soname, found through the dynamic
// loader's search path.
const defaultLibrary = "libcuda.so.1"

// loadWait bounds how long Get waits for the driver to load. Loading is
// dlopen and cuInit, which on a machine with many GPUs and no persistence
// daemon can take tens of seconds, and which a broken driver installation
// can make hang. A caller that waits longer gets an error matching
// ErrNoDriver; the load goes on, and a later Get waits for it again.
const loadWait = 2 * time.Minute

var (
	mu      sync.Mutex
	current Driver
	curErr  error
	loading chan struct{} // non-nil while a load runs; closed when it is done

	// loader is Load; tests replace it (export_test.go) to simulate a load
	// that hangs.
	loader = Load
	// waitFor is loadWait; tests shorten it.
	waitFor = loadWait
)

// IsFake reports whether the process's driver is, now, a stand-in for
// the real one (cudatest's fake, which has no timing model), without
// loading any driver.
func IsFake() bool {
	mu.Lock()
	d := current
	mu.Unlock()
	f, ok := d.(interface{ IsFake() bool })
	return ok && f.IsFake()
}

// Get returns the process's driver, loading and initialising libcuda the
// first time. A failure is remembered: the error matches ErrNoDriver (no
// library, or cuInit failed) or ErrNoDevice (no GPU), and is returned again
// by later calls.
//
// The load runs on its own goroutine and the package's lock is not held
// during it, so no caller waits for more than loadWait (two minutes) even
// when dlopen or cuInit never return; such a caller gets an error matching
// ErrNoDriver, which is not remembered.
func Get() (Driver, error) {
	mu.Lock()
	if current != nil || curErr != nil {
		d, err := current, curErr
		mu.Unlock()
		return d, err
	}
	ch := loading
	path := LibraryPath()
	if ch == nil {
		ch = make(chan struct{})
		loading = ch
		load := loader
		go func() {
			d, err := loadChecked(load, path)
			mu.Lock()
			if loading == ch { // not superseded by Swap
				current, curErr, loading = d, err, nil
			}
			mu.Unlock()
			close(ch)
		}()
	}
	wait := waitFor
	mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
		return nil, &LoadError{Path: path, Err: fmt.Errorf("the driver is still loading after %v (dlopen or cuInit does not return)", wait)}
	}
	mu.Lock()
	defer mu.Unlock()
	if current == nil && curErr == nil {
		// Swapped out meanwhile: report as if nothing had loaded.
		return nil, &LoadError{Path: path, Err: fmt.Errorf("the driver was replaced while loading")}
	}
	return current, curErr
}

// fileKind names the kind of file a non-regular mode is, for messages.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "a special file"
}

// loadChecked refuses a PINMEM_LIBCUDA path that is not a regular file,
// then loads the library with load.
func loadChecked(load func(string) (Driver, error), path string) (Driver, error) {
	if path != defaultLibrary {
		fi, err := os.Stat(path)
		if err != nil {
			return nil, &LoadError{Path: path, Err: fmt.Errorf("%s: %w", EnvLibrary, err)}
		}
		if !fi.Mode().IsRegular() {
			return nil, &LoadError{Path: path, Err: fmt.Errorf("%s names %s, not a regular file", EnvLibrary, fileKind(fi.Mode()))}
		}
	}
	return load(path)
}

// LibraryPath is the library Get loads: $PINMEM_LIBCUDA, or libcuda.so.1
// when it is unset or the process is privileged (see EnvLibrary).
func LibraryPath() string {
	if p := os.Getenv(EnvLibrary); p != "" && !secureExec() {
		return p
	}
	return defaultLibrary
}

// atSecure is the auxiliary-vector key of the kernel's secure-execution flag.
const atSecure = 23

// secureExec reports whether the process runs with privileges its invoker
// lacks: AT_SECURE from /proc/self/auxv, or, where that cannot be read, a
// real and effective user or group that differ.
func secureExec() bool {
	if b, err := os.ReadFile("/proc/self/auxv"); err == nil {
		if v, ok := auxv(b, atSecure); ok {
			return v != 0
		}
	}
	return os.Getuid() != os.Geteuid() || os.Getgid() != os.Getegid()
}

// auxv looks key up in an auxiliary vector: native-endian pairs of words,
// ended by a zero key.
func auxv(b []byte, key uint64) (uint64, bool) {
	w := strconv.IntSize / 8
	word := func(p []byte) uint64 {
		if w == 4 {
			return uint64(binary.NativeEndian.Uint32(p))
		}
		return binary.NativeEndian.Uint64(p)
	}
	for i := 0; i+2*w <= len(b); i += 2 * w {
		k := word(b[i:])
		if k == 0 {
			break
		}
		if k == key {
			return word(b[i+w:]), true
		}
	}
	return 0, false
}

// Swap installs d as the process's driver (nil forgets any driver, so the
// next Get loads the real library again) and returns a function that puts
// back what was there before. It exists for tests: a fake driver stands in
// for libcuda. A load in progress is abandoned: its result is discarded.
func Swap(d Driver) (restore func()) {
	mu.Lock()
	prev, prevErr := current, curErr
	current, curErr, loading = d, nil, nil
	mu.Unlock()
	return func() {
		mu.Lock()
		current, curErr, loading = prev, prevErr, nil
		mu.Unlock()
	}
}
