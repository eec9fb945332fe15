package bench

import (
	"encoding/binary"
	"fmt"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
)

// Variants of the zero-copy bench.
const (
	VariantZeroCopy = "zero-copy" // the kernel reads mapped host memory on every pass
	VariantExplicit = "explicit"  // one copy to device memory, then the kernel reads it there
)

// DefaultReuse are the zero-copy bench's default reuse factors.
var DefaultReuse = []int{1, 2, 4, 8}

// ZeroCopyConfig configures Session.ZeroCopy.
type ZeroCopyConfig struct {
	Size    int64 // bytes of data (default 256 MiB; a multiple of 4)
	Reuse   []int // how many times a kernel reads the data (default DefaultReuse)
	Samples int   // default 5
}

// ZeroCopy compares reading data that lives in host memory through
// zero-copy (read_sum_u32 over mapped memory, crossing PCIe on every pass)
// with copying it to the device once and reading it there, for each reuse
// factor: the seed's advice is that zero-copy pays for data read once.
// Results are in ms (Dir "reuse=R"); both are timed with spin-wait and
// events and verified against the host's sum.
func (s *Session) ZeroCopy(cfg ZeroCopyConfig) ([]Result, error) {
	if cfg.Size <= 0 {
		cfg.Size = 256 << 20
	}
	if len(cfg.Reuse) == 0 {
		cfg.Reuse = DefaultReuse
	}
	if cfg.Samples <= 0 {
		cfg.Samples = 5
	}
	n := int(cfg.Size)
	var out []Result
	skipAll := func(why string) []Result {
		for _, r := range cfg.Reuse {
			for _, v := range []string{VariantZeroCopy, VariantExplicit} {
				out = append(out, skipped("zerocopy", v, fmt.Sprintf("reuse=%d", r), cfg.Size, Ms, why))
			}
		}
		return out
	}
	if n%4 != 0 {
		return nil, fmt.Errorf("bench: zero-copy size %d is not a multiple of 4 bytes", n)
	}
	if s.kernErr != nil {
		return skipAll("kernels unavailable: " + s.kernErr.Error()), nil
	}
	data := randomBytes(n, 31)
	sum := sumWords(data)
	mapped, err := pinmem.Alloc(n, pinmem.Mapped, pinmem.WithDevice(s.Dev), pinmem.WithMethod(pinmem.MethodHostAlloc))
	if err != nil {
		return skipAll("mapped memory: " + err.Error()), nil
	}
	defer mapped.Free()
	mptr, err := mapped.DevicePtr()
	if err != nil {
		return skipAll("mapped memory: " + err.Error()), nil
	}
	copy(mapped.Bytes(), data)
	pinned, err := pinmem.Alloc(n, 0, pinmem.WithDevice(s.Dev), pinmem.WithMethod(pinmem.MethodHostAlloc))
	if err != nil {
		return out, err
	}
	defer pinned.Free()
	copy(pinned.Bytes(), data)
	dev, err := s.Ctx.Alloc(n)
	if err != nil {
		return out, err
	}
	defer dev.Free()
	acc, err := s.Ctx.Alloc(256)
	if err != nil {
		return out, err
	}
	defer acc.Free()
	st, err := s.Ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		return out, err
	}
	defer st.Destroy()
	grid, block := s.grid()
	readSum := s.fns[kernels.KernelReadSum]
	for _, reuse := range cfg.Reuse {
		for _, v := range []string{VariantZeroCopy, VariantExplicit} {
			r := Result{Bench: "zerocopy", Kind: v, Dir: fmt.Sprintf("reuse=%d", reuse), Size: cfg.Size, Unit: Ms}
			op := func(st *cuda.Stream, rep int) error {
				if v == VariantZeroCopy {
					return readSum.Launch(st, grid, block, 0, mptr, uint64(n/4), acc.Ptr())
				}
				if rep == 0 {
					if err := st.CopyHtoD(dev.Ptr(), pinned.Bytes()); err != nil {
						return err
					}
				}
				return readSum.Launch(st, grid, block, 0, dev.Ptr(), uint64(n/4), acc.Ptr())
			}
			lanes := []lane{{s: st, op: op}}
			var vals []float64
			var notes []string
			for i := range cfg.Samples + 1 {
				if i == 1 {
					if err := memsetPrefix(acc, 0, 8); err != nil {
						return out, err
					}
					if v == VariantExplicit {
						if err := memsetPrefix(dev, poisonDevice, n); err != nil {
							return out, err
						}
					}
				}
				t, err := s.timeLanes(lanes, reuse, true)
				if err != nil {
					return out, err
				}
				r.Timing = t.method
				if t.note != "" && len(notes) == 0 {
					notes = append(notes, t.note)
				}
				if i == 1 {
					var got [8]byte
					if err := acc.Read(0, got[:]); err != nil {
						return out, err
					}
					if g, want := binary.LittleEndian.Uint64(got[:]), uint64(reuse)*sum; g != want {
						notes = append(notes, fmt.Sprintf("VERIFY FAILED: sum %#x, want %#x", g, want))
					} else {
						r.Verified = true
					}
				}
				if i > 0 {
					vals = append(vals, Millis(t.span))
				}
			}
			r.fill(vals)
			if v == VariantZeroCopy {
				notes = append(notes, fmt.Sprintf("%s of read_sum_u32 over mapped host memory", passes(reuse)))
			} else {
				notes = append(notes, fmt.Sprintf("one H2D copy from pinned memory, %s over device memory", passes(reuse)))
			}
			r.Note = joinNotes(notes)
			s.progress(r)
			out = append(out, r)
		}
	}
	return out, nil
}

// passes is "1 pass" or "n passes".
func passes(n int) string {
	if n == 1 {
		return "1 pass"
	}
	return fmt.Sprintf("%d passes", n)
}
