//go:build linux

package load

import (
	"context"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

// dropCache writes the file back and asks the kernel to drop its pages.
func dropCache(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Skipf("fadvise DONTNEED: %v", err)
	}
}

func TestResidency(t *testing.T) {
	for _, n := range []int{5000, 3 << 20, 80 << 20} {
		path, _ := tempFile(t, n, 1)
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		warm, ok := residency(f, 0, int64(n))
		if !ok || warm < 0.9 {
			t.Fatalf("%d bytes just written: residency %v, %v; want at least 0.9", n, warm, ok)
		}
		if frac, ok := residency(f, 100, 100); !ok || frac != 1 {
			t.Errorf("empty span: %v, %v", frac, ok)
		}
		dropCache(t, path)
		cold, ok := residency(f, 0, int64(n))
		if !ok {
			t.Fatal("residency failed after fadvise")
		}
		if cold > 0.5 {
			t.Skipf("the kernel kept %.0f%% of the pages after FADV_DONTNEED", 100*cold)
		}
	}
}

// TestFakeAutoChoosesByCache loads a warm file (buffered) and the same file
// after its pages were dropped (direct, or buffered with a fallback where
// the file system refuses O_DIRECT).
func TestFakeAutoChoosesByCache(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	path, data := tempFile(t, 4<<20, 2)
	l := e.loader(t)
	dst := e.devbuf(t, len(data))
	st, err := l.LoadFile(context.Background(), path, dst)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != ModeBuffered || st.Resident < 0.9 {
		t.Errorf("warm file: %+v, want a buffered load of a resident file", st)
	}
	dropCache(t, path)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	frac, _ := residency(f, 0, int64(len(data)))
	f.Close()
	if frac >= DefaultWarmThreshold {
		t.Skipf("the kernel kept %.0f%% of the pages after FADV_DONTNEED", 100*frac)
	}
	if err := dst.Memset(0); err != nil {
		t.Fatal(err)
	}
	st, err = l.LoadFile(context.Background(), path, dst)
	if err != nil {
		t.Fatal(err)
	}
	if st.Resident >= DefaultWarmThreshold || (st.Mode != ModeDirect && st.Fallback == "") {
		t.Errorf("cold file: %+v, want a direct load (or a named fallback)", st)
	}
	t.Logf("cold load: %+v", st)
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
}
