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
	if s.kernErr != nil {
		return zeroCopySkipped(cfg, "kernels unavailable: "+s.kernErr.Error()), nil
	}
	data := randomBytes(n, 31)
	z := &zeroCopyRun{s: s, ctx: ctx, n: n, sum: sumWords(data)}
	mapped, err := pinmem.Alloc(n, pinmem.Mapped, pinmem.WithDevice(s.Dev), pinmem.WithMethod(pinmem.MethodHostAlloc))
	if err != nil {
		return zeroCopySkipped(cfg, "mapped memory: "+err.Error()), nil
	}
	defer mapped.Free()
	if z.mptr, err = mapped.DevicePtr(); err != nil {
		return zeroCopySkipped(cfg, "mapped memory: "+err.Error()), nil
	}
	copy(mapped.Bytes(), data)
	if z.pinned, err = pinmem.Alloc(n, 0, pinmem.WithDevice(s.Dev), pinmem.WithMethod(pinmem.MethodHostAlloc)); err != nil {
		return nil, err
	}
	defer z.pinned.Free()
	copy(z.pinned.Bytes(), data)
	if z.dev, err = s.Ctx.Alloc(n); err != nil {
		return nil, err
	}
	defer z.dev.Free()
	if z.acc, err = s.Ctx.Alloc(256); err != nil {
		return nil, err
	}
	defer z.acc.Free()
	if z.st, err = s.Ctx.NewStream(cuda.StreamNonBlocking); err != nil {
		return nil, err
	}
	defer z.st.Destroy()
	var out []Result
	for _, reuse := range cfg.Reuse {
		for _, v := range []string{VariantZeroCopy, VariantExplicit} {
			r, err := z.measure(v, reuse, cfg)
			if err != nil {
				return out, err
			}
			s.progress(r)
			out = append(out, r)
		}
	}
	return out, nil
}

// zeroCopySkipped returns every row of cfg, skipped for why.
func zeroCopySkipped(cfg ZeroCopyConfig, why string) []Result {
	var out []Result
	for _, r := range cfg.Reuse {
		for _, v := range []string{VariantZeroCopy, VariantExplicit} {
			out = append(out, skipped("zerocopy", v, fmt.Sprintf("reuse=%d", r), cfg.Size, Ms, why))
		}
	}
	return out
}

// zeroCopyRun is one run of ZeroCopy: the data, as mapped host memory
// (mptr), pinned memory and device memory, the sum of its words, and the
// device word read_sum_u32 adds into.
type zeroCopyRun struct {
	s      *Session
	ctx    context.Context
	n      int
	sum    uint64
	mptr   cuda.DevicePtr
	pinned *pinmem.Buffer
	dev    *cuda.DeviceBuffer
	acc    *cuda.DeviceBuffer
	st     *cuda.Stream
}

// measure times variant v reading the data reuse times: a warm-up run,
// then cfg.Samples timed ones, the first of which is verified.
func (z *zeroCopyRun) measure(v string, reuse int, cfg ZeroCopyConfig) (Result, error) {
	r := Result{Bench: "zerocopy", Kind: v, Dir: fmt.Sprintf("reuse=%d", reuse), Size: cfg.Size, Unit: Ms}
	grid, block := z.s.grid()
	readSum := z.s.fns[kernels.KernelReadSum]
	op := func(st *cuda.Stream, rep int) error {
		if v == VariantZeroCopy {
			return readSum.Launch(st, grid, block, 0, z.mptr, uint64(z.n/4), z.acc.Ptr())
		}
		if rep == 0 {
			if err := st.CopyHtoD(z.dev, 0, z.pinned.Bytes()); err != nil {
				return err
			}
		}
		return readSum.Launch(st, grid, block, 0, z.dev.Ptr(), uint64(z.n/4), z.acc.Ptr())
	}
	lanes := []lane{{s: z.st, op: op}}
	var vals []float64
	var notes []string
	for i := range cfg.Samples + 1 {
		if err := z.ctx.Err(); err != nil {
			return r, err
		}
		if i == 1 {
			if err := z.clear(v); err != nil {
				return r, err
			}
		}
		t, err := z.s.timeLanes(lanes, reuse, true)
		if err != nil {
			return r, err
		}
		r.Timing = t.method
		if t.note != "" && len(notes) == 0 {
			notes = append(notes, t.note)
		}
		if i == 1 {
			failed, err := z.verify(reuse)
			if err != nil {
				return r, err
			}
			notes = append(notes, failed...)
			r.Verified = len(failed) == 0
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
	return r, nil
}

// clear zeroes the sum ahead of the verified run, and for the explicit
// variant poisons the device copy, so that the run must write both.
func (z *zeroCopyRun) clear(v string) error {
	if err := memsetPrefix(z.acc, 0, 8); err != nil {
		return err
	}
	if v == VariantExplicit {
		return memsetPrefix(z.dev, poisonDevice, z.n)
	}
	return nil
}

// verify checks the sum of a run of reuse passes: a note when it is wrong.
func (z *zeroCopyRun) verify(reuse int) ([]string, error) {
	var got [8]byte
	if _, err := z.acc.ReadAt(got[:], 0); err != nil {
		return nil, err
	}
	if g, want := binary.LittleEndian.Uint64(got[:]), uint64(reuse)*z.sum; g != want {
		return []string{fmt.Sprintf("VERIFY FAILED: sum %#x, want %#x", g, want)}, nil
	}
	return nil, nil
}

// passes is "1 pass" or "n passes".
func passes(n int) string {
	if n == 1 {
		return "1 pass"
	}
	return fmt.Sprintf("%d passes", n)
}
