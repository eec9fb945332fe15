package safetensors

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestFakeFIFORefused: a path naming a FIFO is refused at once by
// ReadHeader, Load and LoadAll, not opened for ever waiting for a writer.
func TestFakeFIFORefused(t *testing.T) {
	e := newFakeEnv(t)
	fifo := filepath.Join(t.TempDir(), "model.safetensors")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	calls := map[string]func() error{
		"ReadHeader": func() error { _, err := ReadHeader(fifo); return err },
		"Load": func() error {
			_, _, err := Load(context.Background(), e.l, fifo, Into(nil))
			return err
		},
		"LoadAll": func() error { _, err := LoadAll(context.Background(), e.l, fifo); return err },
	}
	for name, call := range calls {
		res := make(chan error, 1)
		go func() { res <- call() }()
		select {
		case err := <-res:
			if !errors.Is(err, fs.ErrInvalid) {
				t.Errorf("%s of a FIFO: %v, want fs.ErrInvalid", name, err)
			}
		case <-time.After(10 * time.Second):
			if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
				w.Close()
			}
			<-res
			t.Fatalf("%s of a FIFO still blocked after 10 s", name)
		}
	}
}
