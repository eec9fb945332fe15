package cudadrv_test

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/cudadrv"
)

// A PINMEM_LIBCUDA that names a FIFO is refused at once: opening it would
// block the loader (and doctor) forever.
func TestLoadRefusesNonRegularFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	for path, kind := range map[string]string{fifo: "a named pipe", dir: "a directory", "/dev/null": "a device"} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			t.Setenv(cudadrv.EnvLibrary, path)
			defer cudadrv.Swap(nil)()
			done := make(chan error, 1)
			go func() { _, err := cudadrv.Get(); done <- err }()
			select {
			case err := <-done:
				var le *cudadrv.LoadError
				if !errors.As(err, &le) || le.Path != path || !errors.Is(err, cudadrv.ErrNoDriver) || !strings.Contains(err.Error(), "names "+kind+", not a regular file") {
					t.Errorf("Get with %s=%s: %v, want a LoadError saying it names %s, not a regular file", cudadrv.EnvLibrary, path, err, kind)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Get with %s=%s hangs", cudadrv.EnvLibrary, path)
			}
		})
	}
}

// A load that never returns does not hang Get's callers past the bound,
// and the timeout is not remembered.
func TestGetBoundedWhenLoadHangs(t *testing.T) {
	release := make(chan struct{})
	restore := cudadrv.SetLoader(func(string) (cudadrv.Driver, error) {
		<-release
		return nil, &cudadrv.LoadError{Path: "hung", Err: errors.New("released")}
	}, 50*time.Millisecond)
	defer restore()
	defer cudadrv.Swap(nil)()
	t.Setenv(cudadrv.EnvLibrary, "")
	start := time.Now()
	errs := make(chan error, 3)
	for range 3 {
		go func() { _, err := cudadrv.Get(); errs <- err }()
	}
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, cudadrv.ErrNoDriver) || !strings.Contains(err.Error(), "still loading") {
				t.Errorf("Get during a hung load = %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Get is not bounded while the load hangs")
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Get took %v", d)
	}
	close(release)
	// The load's own result is what a later Get reports. Each Get waits
	// (up to the 50 ms bound) for the load in flight to end, so the loop
	// only retries while a slow machine has not yet run the released load.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := cudadrv.Get()
		if err != nil && strings.Contains(err.Error(), "released") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the load finished Get = %v", err)
		}
	}
}

func TestAuxvParse(t *testing.T) {
	var b []byte
	for _, kv := range [][2]uint64{{6, 4096}, {23, 1}, {0, 0}, {23, 0}} {
		b = binary.NativeEndian.AppendUint64(b, kv[0])
		b = binary.NativeEndian.AppendUint64(b, kv[1])
	}
	if v, ok := cudadrv.Auxv(b, 23); !ok || v != 1 {
		t.Errorf("AT_SECURE = %d, %v; want 1", v, ok)
	}
	if _, ok := cudadrv.Auxv(b[:16], 23); ok {
		t.Error("found a key that is not there")
	}
	if _, ok := cudadrv.Auxv(b[:20], 99); ok {
		t.Error("found a key in a truncated vector")
	}
	// This test binary is not setuid.
	if os.Getuid() == os.Geteuid() && cudadrv.SecureExec() {
		t.Error("SecureExec in an ordinary process")
	}
}
