package load

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// The order in which a load reads: readers take the plan's reads in order,
// so the plan decides which ranges land first. These tests measure a
// deterministic proxy of that on a model of the readers (pace): p readers
// at one speed each, a read of n bytes taking n units of time, every
// reader taking the next read as soon as it has finished its last (as
// reader does with stages to spare). The proxy for "the first tensor is
// on the device within 5% of the load's time" is the bytes read by all
// readers until the first range's reads are done, against the load's; a
// copy follows each read, so a range is on the device one copy after
// that.

// layout is a load's files, each its ranges as (offset, length) pairs in
// offset order (a checkpoint's tensors, or the parts of them a rank
// loads), at full size.
type layout struct {
	name  string
	files [][][2]int64
}

// tensors returns contiguous ranges of the given sizes from offset off.
func tensors(off int64, sizes ...int64) [][2]int64 {
	var rs [][2]int64
	for _, n := range sizes {
		rs = append(rs, [2]int64{off, n})
		off += n
	}
	return rs
}

// times returns n copies of size, for tensors.
func times(n int, size int64) []int64 {
	s := make([]int64, n)
	for i := range s {
		s[i] = size
	}
	return s
}

// orderLayouts are the layouts the order is measured on. head is where a
// shard's data begins (after its safetensors header).
func orderLayouts() []layout {
	const head, mib = 1504, int64(1 << 20)
	norms := times(4, 16<<10)
	var bench, big, quarters [][][2]int64
	for range 4 {
		// scripts/make-checkpoint.py --gib 4 --shards 4, the bench's checkpoint.
		bench = append(bench, tensors(head, append(append(norms, times(15, 64*mib)...), 64*mib-64<<10)...))
		big = append(big, tensors(head, times(16, 64*mib)...))
		var q [][2]int64
		for _, t := range tensors(head, times(16, 64*mib)...) {
			q = append(q, [2]int64{t[0] + 16*mib, 16 * mib}) // rank 1 of 4 of every tensor
		}
		quarters = append(quarters, q)
	}
	layer := append(times(2, 16<<10), times(4, 32*mib)...)
	var layers1, layers2 []int64
	for range 7 {
		layers1 = append(layers1, layer...)
	}
	for range 8 {
		layers2 = append(layers2, layer...)
	}
	var small [][][2]int64
	for range 4 {
		small = append(small, tensors(head, times(2048, 512<<10)...))
	}
	return []layout{
		{"bench checkpoint: 4 shards of 4 norms and 16 tensors of 64 MiB", bench},
		{"4 shards of 16 tensors of 64 MiB", big},
		{"one file of 4 norms and 64 tensors of 64 MiB", [][][2]int64{tensors(head, append(norms, times(64, 64*mib)...)...)}},
		{"2 shards: a 512 MiB embedding, then layers of 2 norms and 4 tensors of 32 MiB", [][][2]int64{
			tensors(head, append([]int64{512 * mib}, layers1...)...), tensors(head, layers2...)}},
		{"4 shards of 2048 tensors of 512 KiB", small},
		{"a rank's quarter of every tensor of 4 shards of 16 x 64 MiB", quarters},
		{"uneven shards of 32, 2 and 8 tensors of 64 MiB", [][][2]int64{
			tensors(head, times(32, 64*mib)...), tensors(head, times(2, 64*mib)...), tensors(head, times(8, 64*mib)...)}},
	}
}

// scaled returns the layout's files with every offset and length divided
// by div, as Ranges into fake device addresses (for plan) and, when dst
// is not nil, into slices of dst's buffers, one a file.
func (lo layout) scaled(t *testing.T, div int64, dst []*cuda.DeviceBuffer) [][]Range {
	var files [][]Range
	addr := cuda.DevicePtr(1 << 40)
	for f, rs := range lo.files {
		var out []Range
		var at int
		for _, r := range rs {
			n := r[1] / div
			var d *cuda.DeviceBuffer
			if dst != nil {
				v, err := dst[f].Slice(at, int(n))
				if err != nil {
					t.Fatal(err)
				}
				d = v
			} else {
				d = cuda.WrapDevicePtr(nil, addr, int(n))
				addr = addr.Add(int(n))
			}
			at += int(n)
			out = append(out, Range{Offset: r[0] / div, Length: n, Dst: d})
		}
		files = append(files, out)
	}
	return files
}

// planFor returns the reads a load of files would issue, in order, with
// stages of stage bytes and p readers: what run.plan makes of them.
func planFor(files [][]Range, stage, p int) []read {
	r := &run{l: &Loader{cfg: config{stageSize: stage, parallel: p}}}
	base := 0
	for _, rs := range files {
		r.files = append(r.files, &openFile{ranges: rs, base: base})
		base += len(rs)
	}
	r.plan()
	return r.reads
}

// pace runs reads on p readers of one speed: each reader takes the next
// read when it has finished its last, and a read of n bytes takes n units.
// It returns when each read starts and ends.
func pace(reads []read, p int) (start, end []int64) {
	free := make([]int64, p) // when each reader is next free
	for _, rd := range reads {
		w := 0
		for i := range free {
			if free[i] < free[w] {
				w = i
			}
		}
		start = append(start, free[w])
		free[w] += int64(rd.length)
		end = append(end, free[w])
	}
	return start, end
}

// readBy returns the bytes the readers have read by time at.
func readBy(reads []read, start []int64, at int64) int64 {
	var n int64
	for k, rd := range reads {
		n += min(int64(rd.length), max(0, at-start[k]))
	}
	return n
}

// orderFigures is what the model says of one load.
type orderFigures struct {
	total     int64   // bytes the load reads
	reads     int     // read requests
	first     int64   // bytes read by all readers until the first range is read
	firstTime float64 // when the first range is read, as a share of the load's time
	worstLag  int64   // the most bytes read until a range is read beyond the bytes of the files up to its end
	bound     int64   // the most that first may be: its bytes, and one read of each other reader
}

// measureOrder models the load of files with stage and p and checks that
// every range lands within p stages of its place in file order, and the
// first one as early as p readers allow.
func measureOrder(t *testing.T, files [][]Range, stage, p int) orderFigures {
	t.Helper()
	reads := planFor(files, stage, p)
	start, end := pace(reads, p)
	var fig orderFigures
	fig.reads = len(reads)
	done := map[int]int64{} // when each range (by its index in the load) is read
	for k, rd := range reads {
		fig.total += int64(rd.length)
		for _, pc := range rd.pieces {
			done[pc.rng] = max(done[pc.rng], end[k])
		}
	}
	whole := end[len(end)-1]
	for _, e := range end {
		whole = max(whole, e)
	}
	var before int64 // the bytes the files before this one span
	base, firstSeen, worst := 0, false, ""
	work := 0 // reads that contiguous stage-sized reads of every file's span take
	for f, rs := range files {
		lo := rs[0].Offset
		var hi int64
		for i, r := range rs {
			hi = max(hi, r.Offset+r.Length)
			got := readBy(reads, start, done[base+i])
			if !firstSeen {
				firstSeen = true
				fig.first, fig.firstTime = got, float64(done[base+i])/float64(whole)
				fig.bound = r.Length + int64(p-1)*min(r.Length, int64(stage))
			}
			// Bytes of the files, in order, up to this range's end.
			if lag := got - (before + hi - lo); lag > fig.worstLag {
				fig.worstLag, worst = lag, fmt.Sprintf("range %d of file %d (at %d, %d bytes)", i, f, r.Offset, r.Length)
			}
		}
		before += hi - lo
		work += int((hi - lo + int64(stage) - 1) / int64(stage))
		base += len(rs)
	}
	if fig.worstLag > int64(p*stage) {
		t.Errorf("%s is read %d bytes after its place in file order: more than %d readers' stages", worst, fig.worstLag, p)
	}
	if fig.first > fig.bound {
		t.Errorf("the first range is read after %d bytes (%.2f%% of the load's %d), more than its own bytes and one read of each other reader (%d)",
			fig.first, 100*float64(fig.first)/float64(fig.total), fig.total, fig.bound)
	}
	// The same work as reading each file's span in stages: no more bytes,
	// and at most one read more for each reader (the first range's).
	if fig.total > before || fig.reads > work+p {
		t.Errorf("%d reads of %d bytes, for files spanning %d bytes in %d stage-sized reads", fig.reads, fig.total, before, work)
	}
	// No serialisation: the readers finish together, within one read.
	if whole > (fig.total+int64(p)-1)/int64(p)+int64(stage) {
		t.Errorf("the readers finish at %d, after %d bytes shared by %d readers", whole, fig.total, p)
	}
	return fig
}

// TestReadOrder measures, on every layout, at the Loader's defaults on
// the H100 host (16 readers, 4 MiB stages), how many bytes are read
// before the first range is on the device and how far any range lands
// behind its place in file order. Before, the plan took the files' reads
// in turn (the first read of every file, then the second ...) and let the
// first range share a stage with the next: on the bench's checkpoint the
// first tensor (16 KiB) was read after 128 MiB (3.1% of the load: 16
// readers each filling a stage; now 0.25 MiB, 0.006%), with 16 tensors of
// 64 MiB in each of 4 shards after 256 MiB (6.3%; now 64 MiB, 1.6%), and
// a shard's last tensor landed 3 GiB after its place in the files (now at
// most 64 MiB, the readers' stages).
func TestReadOrder(t *testing.T) {
	const stage, p = DefaultStageSize, DefaultParallelism
	for _, lo := range orderLayouts() {
		t.Run(lo.name, func(t *testing.T) {
			fig := measureOrder(t, lo.scaled(t, 1, nil), stage, p)
			t.Logf("%d reads of %d MiB; first range read after %.3g MiB = %.3f%% of the load's bytes, %.3f%% of its time (bound %.3g MiB); worst lag %.3g MiB",
				fig.reads, fig.total>>20, float64(fig.first)/(1<<20), 100*float64(fig.first)/float64(fig.total), 100*fig.firstTime, float64(fig.bound)/(1<<20), float64(fig.worstLag)/(1<<20))
		})
	}
}

// TestFakeReadOrder loads every layout, scaled down (stages too), on the
// fake driver in the read order TestReadOrder measures, and checks every
// byte of every range and that each range is announced once, once its
// bytes are on the device.
func TestFakeReadOrder(t *testing.T) {
	div := int64(256)
	if testing.Short() {
		div = 1024
	}
	stage, p := int(DefaultStageSize/div), DefaultParallelism
	e := newFakeEnv(t, fakedrv.Options{})
	l := e.loader(t, WithStageSize(stage), WithParallelism(p), WithDepth(2*p))
	for n, lo := range orderLayouts() {
		t.Run(lo.name, func(t *testing.T) {
			model := lo.scaled(t, div, nil)
			measureOrder(t, model, stage, p) // the same bounds at this scale
			var bufs []*cuda.DeviceBuffer
			var files []File
			var data [][]byte
			dir := t.TempDir()
			for f, rs := range model {
				var size, end int64
				for _, r := range rs {
					size += r.Length
					end = max(end, r.Offset+r.Length)
				}
				bufs = append(bufs, e.devbuf(t, int(size)))
				d := testutil.RandomBytes(int(end), uint64(100*n+f))
				path := filepath.Join(dir, fmt.Sprintf("shard%d", f))
				if err := os.WriteFile(path, d, 0o644); err != nil {
					t.Fatal(err)
				}
				files, data = append(files, File{Path: path}), append(data, d)
			}
			for f, rs := range lo.scaled(t, div, bufs) {
				files[f].Ranges = rs
			}
			var mu sync.Mutex
			seen := map[[2]int]int{}
			st, err := l.LoadFiles(context.Background(), files, func(f, i int) {
				r := files[f].Ranges[i]
				m, err := e.d.DeviceBytes(cudadrv.DevicePtr(r.Dst.Ptr()), uint64(r.Length))
				mu.Lock()
				defer mu.Unlock()
				seen[[2]int{f, i}]++
				if err != nil || testutil.FirstMismatch(data[f][r.Offset:r.Offset+r.Length], m) >= 0 {
					t.Errorf("range %d of file %d announced before its bytes were on the device (%v)", i, f, err)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if want := len(planFor(model, stage, p)); st.Reads != want {
				t.Errorf("the load issued %d reads, the plan %d", st.Reads, want)
			}
			for f, rs := range files {
				for i, r := range rs.Ranges {
					if seen[[2]int{f, i}] != 1 {
						t.Errorf("range %d of file %d announced %d times", i, f, seen[[2]int{f, i}])
					}
					testutil.CheckBytes(t, data[f][r.Offset:r.Offset+r.Length], e.deviceBytes(t, r.Dst, int(r.Length)))
				}
			}
		})
	}
}
