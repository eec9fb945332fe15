package pinmem

import (
	"cmp"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

var benchSizes = []struct {
	name string
	n    int
	big  bool // skipped with -test.short
}{
	{"1MiB", 1 << 20, false},
	{"64MiB", 64 << 20, false},
	{"1GiB", 1 << 30, true},
	{"4GiB", 4 << 30, true},
}

// BenchmarkPin measures pinning and releasing: cuMemHostAlloc/cuMemFreeHost
// against pinmem's mmap + parallel touch + chunked cuMemHostRegister /
// unregister + munmap, in one run. It reports the median ms for pinning and
// for freeing separately (the sizes of 1 GiB and up take 3 samples of
// cuMemHostAlloc and 5 of pinmem per iteration), the slowest pin, and the
// ratio of each median to the hostalloc figure of the same size when that
// ran first in the same process.
func BenchmarkPin(b *testing.B) {
	newGPUEnv(b, 0)
	type key struct{ size int }
	ref := map[key][2]float64{} // hostalloc pin, free ms
	methods := []struct {
		name string
		m    Method
		opts []Option
	}{
		{"hostalloc", MethodHostAlloc, nil},
		{"mmap-register", MethodMmapRegister, nil},
	}
	for _, m := range methods {
		b.Run(m.name, func(b *testing.B) {
			for _, sz := range benchSizes {
				b.Run(sz.name, func(b *testing.B) {
					if sz.big && testing.Short() {
						b.Skip("big sizes need -test.short=false")
					}
					// Each b.Loop iteration pins reps times, so that the
					// big sizes, which run once at a short -test.benchtime,
					// still report a median of several samples.
					reps := 1
					if sz.big {
						reps = 3
						if m.m == MethodMmapRegister {
							reps = 5
						}
					}
					var pins, frees, maps, touches, regs []time.Duration
					for b.Loop() {
						for range reps {
							pin, free, ph := pinOnce(b, sz.n, append([]Option{WithMethod(m.m)}, m.opts...)...)
							pins = append(pins, pin)
							frees = append(frees, free)
							maps = append(maps, ph.mapped)
							touches = append(touches, ph.touched-ph.mapped)
							regs = append(regs, ph.registered-ph.touched)
						}
					}
					ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
					pms, fms := ms(median(pins)), ms(median(frees))
					b.ReportMetric(0, "ns/op")
					b.ReportMetric(pms, "pin-ms")
					b.ReportMetric(fms, "free-ms")
					b.ReportMetric(ms(slices.Max(pins)), "pin-max-ms")
					b.ReportMetric(float64(len(pins)), "samples")
					if m.m == MethodMmapRegister {
						b.ReportMetric(ms(median(maps)), "map-ms")
						b.ReportMetric(ms(median(touches)), "touch-ms")
						b.ReportMetric(ms(median(regs)), "register-ms")
					}
					k := key{sz.n}
					if m.m == MethodHostAlloc {
						ref[k] = [2]float64{pms, fms}
					} else if r, ok := ref[k]; ok && pms > 0 && fms > 0 {
						b.ReportMetric(r[0]/pms, "pin-speedup-x")
						b.ReportMetric(r[1]/fms, "free-speedup-x")
					}
				})
			}
		})
	}
}

// pinPhases are the times, from the start of the pin, at which a mapping
// was made (and placed), its pages were touched, and it was registered.
type pinPhases struct{ mapped, touched, registered time.Duration }

// pinOnce pins n bytes with opts, frees them, and returns how long each
// took and the phases of the pin (zero for cuMemHostAlloc memory).
func pinOnce(b *testing.B, n int, opts ...Option) (pin, free time.Duration, ph pinPhases) {
	b.Helper()
	pinPhasesHook = func(m, t, r time.Duration) { ph = pinPhases{m, t, r} }
	defer func() { pinPhasesHook = nil }()
	t0 := time.Now()
	buf, err := Alloc(n, 0, opts...)
	if err != nil {
		b.Fatal(err)
	}
	t1 := time.Now()
	if err := buf.Free(); err != nil {
		b.Fatal(err)
	}
	return t1.Sub(t0), time.Since(t1), ph
}

// BenchmarkPinVsC interleaves pinmem's fast pinning (mmap + huge pages +
// parallel touch + one cuMemHostRegister, MethodMmapRegister) with the same
// method written in C (cref/bw --pin-cost --fast-only, one sample per round;
// path in PINMEM_CREF_BW), at 1 GiB and 4 GiB, and reports the medians of
// pin and free times and their ratios. Both sides give each touching
// goroutine one contiguous share of the range (metric names start with
// "share-"); the phases (touch, register) are reported for both, so a slow
// host shows where its time went. Both sides touch with one thread per CPU and place nothing on
// a NUMA node. pinmem's "touch" phase includes the mapping, as C's does.
// Run it with -test.benchtime=1x.
func BenchmarkPinVsC(b *testing.B) {
	newGPUEnv(b, 0)
	cprog := os.Getenv("PINMEM_CREF_BW")
	if cprog == "" {
		b.Skip("PINMEM_CREF_BW (cref/build's bw) not set")
	}
	if testing.Short() {
		b.Skip("pins 4 GiB; needs -test.short=false")
	}
	units := []struct{ name string }{{"share"}}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	// The same number of touching threads on both sides (pinmem's default),
	// and no NUMA placement, which the C program does not do either
	// (BenchmarkPin measures the defaults).
	threads := runtime.NumCPU()
	const rounds = 7
	for _, n := range []int{1 << 30, 4 << 30} {
		b.Run(fmt.Sprintf("%dGiB", n>>30), func(b *testing.B) {
			gs := map[string][]float64{}
			cs := map[string][]float64{}
			for i := 0; i < b.N; i++ {
				for range rounds {
					for _, u := range units {
						pin, free, ph := pinOnce(b, n, WithMethod(MethodMmapRegister), WithThreads(threads), WithNUMANode(NUMANone))
						gs[u.name+"-pin"] = append(gs[u.name+"-pin"], ms(pin))
						gs[u.name+"-free"] = append(gs[u.name+"-free"], ms(free))
						gs[u.name+"-touch"] = append(gs[u.name+"-touch"], ms(ph.touched))
						gs[u.name+"-register"] = append(gs[u.name+"-register"], ms(ph.registered-ph.touched))
					}
					for _, rec := range testutil.RunCref(b, cprog, "--pin-cost", "--fast-only", "--threads", strconv.Itoa(threads),
						"--samples", "1", strconv.Itoa(n)) {
						cs[rec.Kind] = append(cs[rec.Kind], rec.Median)
					}
				}
			}
			if len(cs["fast-pin"]) == 0 {
				b.Fatalf("%s printed no fast-pin result", cprog)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(median(cs["fast-pin"]), "c-pin-ms")
			b.ReportMetric(median(cs["fast-unpin"]), "c-free-ms")
			b.ReportMetric(median(cs["fast-pin-touch"]), "c-touch-ms")
			b.ReportMetric(median(cs["fast-pin-register"]), "c-register-ms")
			for _, u := range units {
				for _, ph := range []string{"pin", "free", "touch", "register"} {
					b.ReportMetric(median(gs[u.name+"-"+ph]), u.name+"-"+ph+"-ms")
				}
				b.ReportMetric(slices.Max(gs[u.name+"-pin"]), u.name+"-pin-max-ms")
				b.ReportMetric(median(gs[u.name+"-pin"])/median(cs["fast-pin"]), u.name+"-go/c-pin")
				b.ReportMetric(median(gs[u.name+"-free"])/median(cs["fast-unpin"]), u.name+"-go/c-free")
			}
		})
	}
}

// BenchmarkPinThreshold finds where MethodAuto should switch from
// cuMemHostAlloc to mmap + register (AutoMmapThreshold): for each size it
// pins and frees a buffer both ways, alternating which goes first, and
// reports each method's median pin+free time and mmap-register's over
// hostalloc's (below 1: mmap-register is faster at that size).
func BenchmarkPinThreshold(b *testing.B) {
	newGPUEnv(b, 0)
	for _, n := range []int{4 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20} {
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			methods := []Method{MethodHostAlloc, MethodMmapRegister}
			times := make([][]time.Duration, 2)
			for i := 0; b.Loop(); i++ {
				for j := range methods {
					k := (i + j) % 2
					pin, free, _ := pinOnce(b, n, WithMethod(methods[k]))
					times[k] = append(times[k], pin+free)
				}
			}
			h, m := median(times[0]), median(times[1])
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(h.Microseconds()), "hostalloc-us")
			b.ReportMetric(float64(m.Microseconds()), "mmap-us")
			if h > 0 {
				b.ReportMetric(float64(m)/float64(h), "mmap/hostalloc")
			}
		})
	}
}

// median returns the median of v (the upper one of an even count; zero
// for none).
func median[T cmp.Ordered](v []T) T {
	var zero T
	if len(v) == 0 {
		return zero
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

var copySizes = []struct {
	name string
	n    int
}{{"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"16MiB", 16 << 20}, {"256MiB", 256 << 20}}

// BenchmarkCopy measures H2D and D2H bandwidth (GPU events around one async
// copy per iteration) for every kind of host buffer and for a pageable Go
// slice, and reports GB/s (10^9 bytes per second).
func BenchmarkCopy(b *testing.B) {
	const maxSize = 256 << 20
	g := newGPUEnv(b, maxSize)
	kinds := []struct {
		name string
		make func() (*Buffer, []byte, error)
	}{
		{"hostalloc", func() (*Buffer, []byte, error) {
			x, err := Alloc(maxSize, 0, WithMethod(MethodHostAlloc))
			return x, x.Bytes(), err
		}},
		{"writecombined", func() (*Buffer, []byte, error) {
			x, err := Alloc(maxSize, WriteCombined, WithMethod(MethodHostAlloc))
			return x, x.Bytes(), err
		}},
		{"mmap-register", func() (*Buffer, []byte, error) {
			x, err := Alloc(maxSize, 0, WithMethod(MethodMmapRegister))
			return x, x.Bytes(), err
		}},
		{"go-register", func() (*Buffer, []byte, error) {
			mem := make([]byte, maxSize)
			x, err := Register(mem, 0)
			return x, mem, err
		}},
		{"pageable", func() (*Buffer, []byte, error) { return nil, make([]byte, maxSize), nil }},
	}
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			buf, mem, err := k.make()
			if err != nil {
				b.Fatal(err)
			}
			if buf != nil {
				defer buf.Free()
			}
			for i := range mem {
				mem[i] = byte(i)
			}
			for _, dir := range []string{"H2D", "D2H"} {
				for _, sz := range copySizes {
					b.Run(fmt.Sprintf("%s/%s", dir, sz.name), func(b *testing.B) {
						host := mem[:sz.n]
						var gpu time.Duration
						b.SetBytes(int64(sz.n))
						for b.Loop() {
							gpu += g.copyTimed(b, host, dir == "H2D")
						}
						b.ReportMetric(float64(sz.n)*float64(b.N)/gpu.Seconds()/1e9, "GB/s")
					})
				}
			}
		})
	}
}
