//go:build linux

package uring

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReads reads a file in pieces through a ring, into registered
// buffers and into plain ones, and checks every byte and completion.
func TestReads(t *testing.T) {
	r, err := New(8)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		t.Skipf("io_uring unavailable: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data := make([]byte, 1<<20+123)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const piece = 64 << 10
	bufs := [][]byte{make([]byte, piece), make([]byte, piece), make([]byte, piece)}
	if err := r.Register(bufs[:2]); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(data))
	for off := 0; off < len(data); off += 3 * piece {
		n := 0
		for k := range 3 {
			o := off + k*piece
			if o >= len(data) {
				break
			}
			index := k
			if k == 2 {
				index = -1 // not registered
			}
			if !r.Read(int(f.Fd()), bufs[k], int64(o), index, uint64(k)) {
				t.Fatal("submission queue full")
			}
			n++
		}
		if err := r.Submit(n); err != nil {
			t.Fatal(err)
		}
		var cs []Completion
		for len(cs) < n {
			cs = r.Reap(cs)
			if len(cs) < n {
				if err := r.Submit(n - len(cs)); err != nil {
					t.Fatal(err)
				}
			}
		}
		res := make([]int32, 3)
		for _, c := range cs {
			res[c.Tag] = c.Res
		}
		for k := range n {
			if res[k] < 0 {
				t.Fatalf("read %d: errno %d", k, -res[k])
			}
			got = append(got, bufs[k][:res[k]]...)
		}
	}
	if !bytes.Equal(got, data) || r.InFlight() != 0 {
		t.Errorf("read %d bytes back, %d in flight; want the file's %d", len(got), r.InFlight(), len(data))
	}
	if _, err := New(3); err == nil {
		t.Error("New(3) accepted")
	}
}
