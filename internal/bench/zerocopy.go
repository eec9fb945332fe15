package bench

import (
	"context"
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

// MaxReuse bounds ZeroCopyConfig.Reuse factors.
const MaxReuse = 1000

// ZeroCopyConfig configures Session.ZeroCopy. Zero fields take their
// defaults; out-of-range fields make ZeroCopy fail with ErrInvalid.
type ZeroCopyConfig struct {
	Size    int64 `json:"size_bytes"` // bytes of data, a multiple of 4 up to MaxSize (0: 256 MiB)
	Reuse   []int `json:"reuse"`      // kernel passes over the data, 1 to MaxReuse each (empty: DefaultReuse)
	Samples int   `json:"samples"`    // timed samples per measurement, up to MaxSamples (0: 5)
}

// Validate reports the first field of c that ZeroCopy would refuse, as an
// error matching ErrInvalid; c is not changed. ZeroCopy validates its
// configuration itself: calling Validate first finds the error before any
// GPU work (the CLI checks its flags this way).
func (c ZeroCopyConfig) Validate() error { return c.resolve() }

// Resolved returns c with its defaults filled in, as the measurement uses
// it (reports record it), or the error Validate gives.
func (c ZeroCopyConfig) Resolved() (ZeroCopyConfig, error) {
	err := c.resolve()
	return c, err
}

// resolve fills in the defaults of c's zero fields and checks the others.
func (c *ZeroCopyConfig) resolve() error {
	switch {
	case c.Size == 0:
		c.Size = 256 << 20
	case c.Size < 0 || c.Size > MaxSize || c.Size%4 != 0:
		return invalid("ZeroCopyConfig.Size %d: want a multiple of 4 bytes from 4 to %d (0: the default, 256 MiB)", c.Size, int64(MaxSize))
	}
	if len(c.Reuse) == 0 {
		c.Reuse = DefaultReuse
	}
	for _, r := range c.Reuse {
		if r < 1 || r > MaxReuse {
			return invalid("ZeroCopyConfig.Reuse: factor %d: want 1 to %d", r, MaxReuse)
		}
	}
	return checkSamples("ZeroCopyConfig.Samples", &c.Samples, 5)
}

// ZeroCopy compares reading data that lives in host memory through
// zero-copy (read_sum_u32 over mapped memory, crossing PCIe on every pass)
// with copying it to the device once and reading it there, for each reuse
// factor: zero-copy pays for data read once, and loses once the data is
// read often enough that one copy and fast device reads cost less.
// Results are in ms (Dir "reuse=R"); both are timed with spin-wait and
// events and verified against the host's sum. ctx is checked before each
// sample (see Session).
func (s *Session) ZeroCopy(ctx context.Context, cfg ZeroCopyConfig) ([]Result, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	if err := cfg.resolve(); err != nil {
		return nil, err
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
					if err := st.CopyHtoD(dev, 0, pinned.Bytes()); err != nil {
						return err
					}
				}
				return readSum.Launch(st, grid, block, 0, dev.Ptr(), uint64(n/4), acc.Ptr())
			}
			lanes := []lane{{s: st, op: op}}
			var vals []float64
			var notes []string
			for i := range cfg.Samples + 1 {
				if err := ctx.Err(); err != nil {
					return out, err
				}
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
					if _, err := acc.ReadAt(got[:], 0); err != nil {
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
