//go:build unix

package regfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestOpen: a regular file opens with its size; a directory and a FIFO
// are refused with fs.ErrInvalid, the FIFO without blocking; a missing
// file is fs.ErrNotExist.
func TestOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, make([]byte, 10), 0o600); err != nil {
		t.Fatal(err)
	}
	f, fi, err := Open(path)
	if err != nil || fi.Size() != 10 {
		t.Fatalf("Open of a regular file: %v, %v", fi, err)
	}
	f.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if f, _, err := OpenIn(root, "f"); err != nil {
		t.Fatalf("OpenIn of a regular file: %v", err)
	} else {
		f.Close()
	}
	if _, _, err := OpenIn(root, "../f"); err == nil {
		t.Error("OpenIn left its root")
	}
	if _, _, err := Open(dir); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("Open of a directory: %v, want fs.ErrInvalid", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err == nil {
		if _, _, err := Open(fifo); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("Open of a FIFO: %v, want fs.ErrInvalid", err)
		}
	}
	if _, _, err := Open(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of a missing file: %v, want fs.ErrNotExist", err)
	}
}
