//go:build linux

package load

import (
	"context"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/regfile"
	"github.com/pinmem/pinmem/internal/tools/testutil"
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
		warm, ok := residency(f, []extent{{0, int64(n)}})
		if !ok || warm < 0.9 {
			t.Fatalf("%d bytes just written: residency %v, %v; want at least 0.9", n, warm, ok)
		}
		if frac, ok := residency(f, nil); !ok || frac != 1 {
			t.Errorf("empty span: %v, %v", frac, ok)
		}
		dropCache(t, path)
		cold, ok := residency(f, []extent{{0, int64(n)}})
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
	e := newFakeEnv(t, fakedrv.Options{})
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
	frac, _ := residency(f, []extent{{0, int64(len(data))}})
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

// TestFakeAutoSamplesOnlyTheRanges loads the first and last 4 MiB of a
// 72 MiB file whose middle alone was dropped from the page cache: every
// byte to be read is cached, so ModeAuto must find them resident and read
// buffered, whatever the pages between the ranges hold.
func TestFakeAutoSamplesOnlyTheRanges(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	const n, part = 72 << 20, 4 << 20
	path, data := tempFile(t, n, 17)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), part, n-2*part, unix.FADV_DONTNEED); err != nil {
		t.Skipf("fadvise DONTNEED: %v", err)
	}
	hole, _ := residency(f, []extent{{part, n - part}})
	ends, _ := residency(f, []extent{{0, part}, {n - part, n}})
	if hole > 0.5 || ends < 0.9 {
		t.Skipf("after FADV_DONTNEED of the middle: %.0f%% of it and %.0f%% of the ends cached", 100*hole, 100*ends)
	}
	l := e.loader(t, WithMode(ModeAuto))
	head, tail := e.devbuf(t, part), e.devbuf(t, part)
	st, err := l.Load(context.Background(), path, []Range{{Offset: 0, Length: part, Dst: head}, {Offset: n - part, Length: part, Dst: tail}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Resident < 0.9 || st.Mode != ModeBuffered {
		t.Errorf("ranges entirely in the page cache: %+v, want a buffered load with Resident near 1", st)
	}
	testutil.CheckBytes(t, data[:part], e.deviceBytes(t, head, part))
	testutil.CheckBytes(t, data[n-part:], e.deviceBytes(t, tail, part))
}

// TestFakeDirectTailOnStrictKernel emulates kernels (ext4 before Linux
// 5.5, RHEL 8's 4.18 among them) whose direct read at an unaligned offset
// fails with EINVAL even at the end of the file. os.File.ReadAt, asked for
// an aligned length that runs past an unaligned end of file, issues such a
// read after the short one. A direct load of a file whose size is not a
// multiple of Align must still read directly to the end, without a
// fallback, and deliver every byte.
func TestFakeDirectTailOnStrictKernel(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	prev := directReadAt
	directReadAt = func(f *os.File, b []byte, off int64) (int, error) {
		fi, err := f.Stat()
		if err != nil {
			return 0, err
		}
		n, err := f.ReadAt(b, off)
		if size := fi.Size(); off+int64(len(b)) > size && size%Align != 0 && off+int64(n) == size {
			// ReadAt's next pread, at the unaligned end of the file.
			return n, &os.PathError{Op: "read", Path: f.Name(), Err: unix.EINVAL}
		}
		return n, err
	}
	defer func() { directReadAt = prev }()
	for _, n := range []int{5000, 64<<10 + 1, 300000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			path, data := tempFile(t, n, uint64(n))
			pf, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			f, err := openDirect(pf)
			pf.Close()
			if err != nil {
				t.Skipf("O_DIRECT refused here: %v", err)
			}
			f.Close()
			l := e.loader(t, WithMode(ModeDirect))
			dst := e.devbuf(t, n)
			st, err := l.LoadFile(context.Background(), path, dst)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode != ModeDirect || st.Fallback != "" {
				t.Errorf("stats %+v, want a direct load without fallback", st)
			}
			testutil.CheckBytes(t, data, e.deviceBytes(t, dst, n))
		})
	}
}

// TestFakeDecidePerFile: with ModeAuto a warm file is read buffered and a
// cold one beside it directly, in one load; every byte right.
func TestFakeDecidePerFile(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	warm, warmData := tempFile(t, 1<<20, 71)
	cold, coldData := tempFile(t, 1<<20, 72)
	f, err := os.Open(cold)
	if err != nil {
		t.Fatal(err)
	}
	if err = f.Sync(); err == nil {
		err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	}
	frac, ok := residency(f, []extent{{0, 1 << 20}})
	f.Close()
	if err != nil || !ok || frac >= DefaultWarmThreshold {
		t.Skipf("cannot drop the file's pages here (resident %v, %v)", frac, err)
	}
	l := e.loader(t)
	a, b := e.devbuf(t, 1<<20), e.devbuf(t, 1<<20)
	files := []File{
		{Path: warm, Ranges: []Range{{Offset: 0, Length: 1 << 20, Dst: a}}},
		{Path: cold, Ranges: []Range{{Offset: 0, Length: 1 << 20, Dst: b}}},
	}
	r := &run{l: l}
	for _, fl := range files {
		of := &openFile{path: fl.Path, ranges: fl.Ranges}
		if of.f, of.fi, err = regfile.Open(fl.Path); err != nil {
			t.Fatal(err)
		}
		r.files = append(r.files, of)
	}
	r.decide()
	modes := []Mode{r.files[0].mode, r.files[1].mode}
	r.closeFiles()
	if modes[0] != ModeBuffered || (modes[1] != ModeDirect && r.files[1].fallback.Load() == nil) {
		t.Errorf("modes %v, want buffered for the warm file and direct for the cold one", modes)
	}
	if _, err := l.LoadFiles(context.Background(), files, nil); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, warmData, e.deviceBytes(t, a, 1<<20))
	testutil.CheckBytes(t, coldData, e.deviceBytes(t, b, 1<<20))
}
