package load

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestFakeLoadFiles loads ranges of three files at once: every byte right,
// each range announced once, with its bytes already on the device.
func TestFakeLoadFiles(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	var files []File
	var want [][][]byte
	for k, n := range []int{1 << 20, 300001, 5} {
		path, data := tempFile(t, n, uint64(50+k))
		f := File{Path: path}
		var w [][]byte
		for off := 0; off < n; off += 200000 {
			m := min(200000, n-off)
			f.Ranges = append(f.Ranges, Range{Offset: int64(off), Length: int64(m), Dst: e.devbuf(t, m)})
			w = append(w, data[off:off+m])
		}
		f.Ranges = append(f.Ranges, Range{Offset: 0, Length: 0}) // empty: never announced
		files, want = append(files, f), append(want, w)
	}
	seen := map[[2]int]int{}
	l := e.loader(t)
	st, err := l.LoadFiles(context.Background(), files, func(file, rng int) {
		seen[[2]int{file, rng}]++
		r := files[file].Ranges[rng]
		if off := testutil.FirstMismatch(want[file][rng], e.deviceBytes(t, r.Dst, int(r.Length))); off >= 0 {
			t.Errorf("range %d of file %d announced before its byte %d landed", rng, file, off)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Bytes != 1<<20+300001+5 {
		t.Errorf("stats %+v", st)
	}
	for k, f := range files {
		for j, r := range f.Ranges {
			if n := seen[[2]int{k, j}]; (r.Length > 0) != (n == 1) || n > 1 {
				t.Errorf("range %d of file %d (length %d) announced %d times", j, k, r.Length, n)
			}
			if r.Length > 0 {
				testutil.CheckBytes(t, want[k][j], e.deviceBytes(t, r.Dst, int(r.Length)))
			}
		}
	}
}

// TestFakeLoadFilesOverlap: destinations that overlap across files are a
// *RangeError naming the file, before anything is read.
func TestFakeLoadFilesOverlap(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	a, _ := tempFile(t, 4096, 60)
	b, _ := tempFile(t, 4096, 61)
	dst := e.devbuf(t, 4096)
	l := e.loader(t)
	st, err := l.LoadFiles(context.Background(), []File{
		{Path: a, Ranges: []Range{{Offset: 0, Length: 4096, Dst: dst}}},
		{Path: b, Ranges: []Range{{Offset: 0, Length: 100, Dst: dst}}},
	}, nil)
	var re *RangeError
	if !errors.As(err, &re) || !errors.Is(err, ErrRange) || !strings.Contains(re.Reason, "file") || st.ReadBytes != 0 {
		t.Errorf("overlapping destinations across files: %v, %+v", err, st)
	}
}
