//go:build linux

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/load"
)

// TestDirectReadTail: the disk's O_DIRECT reference read of a file whose
// size is not a multiple of load.Align (a safetensors shard, as a rule)
// reads it to the end on a kernel that refuses a direct read at the
// file's unaligned end (EINVAL, ext4 before Linux 5.5), as the loader
// does, rather than failing and leaving the cold read-direct row skipped.
func TestDirectReadTail(t *testing.T) {
	prev := directReadAt
	directReadAt = func(f *os.File, b []byte, off int64) (int, error) {
		fi, err := f.Stat()
		if err != nil {
			return 0, err
		}
		n, err := f.ReadAt(b, off)
		if size := fi.Size(); off+int64(len(b)) > size && size%load.Align != 0 && off+int64(n) == size {
			// ReadAt's next pread, at the unaligned end of the file.
			return n, &os.PathError{Op: "read", Path: f.Name(), Err: unix.EINVAL}
		}
		return n, err
	}
	t.Cleanup(func() { directReadAt = prev })
	for _, n := range []int{5000, 64<<10 + 1, 300000, 128 << 10} {
		path := filepath.Join(t.TempDir(), fmt.Sprint(n))
		if err := os.WriteFile(path, make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
		if f, err := openDirectFile(path); err != nil {
			t.Skipf("O_DIRECT refused here: %v", err)
		} else {
			f.Close()
		}
		if err := directRead(path, int64(n), 3, 64<<10); err != nil {
			t.Errorf("direct read of %d bytes: %v", n, err)
		}
	}
}
