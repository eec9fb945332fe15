package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/transfer"
)

// ConcurrencyConfig configures Session.Concurrency. Zero fields take their
// defaults; out-of-range fields make Concurrency fail with ErrInvalid.
type ConcurrencyConfig struct {
	Goroutines []int    `json:"goroutines"`  // goroutines copying at once, 1 to 256 each (empty: 1, 4, 16)
	Sizes      []int64  `json:"sizes_bytes"` // bytes each goroutine moves per copy (empty: 1 MiB and 24 MiB)
	Dirs       []string `json:"dirs"`        // h2d, d2h (empty: both)
	Samples    int      `json:"samples"`     // timed samples per measurement, up to MaxSamples (0: 5)
	// MinBytes is the least a sample moves in all (0: 64 MiB); each
	// goroutine repeats its copy up to 64 times to reach it.
	MinBytes int64 `json:"min_bytes"`
}

// Kinds of the concurrency bench: a default Copier shared by every
// goroutine, or each goroutine calling the driver's synchronous copy.
var concurrencyKinds = []string{KindCopier, KindPageableSync}

// Resolved returns c with its defaults filled in, or an error matching
// ErrInvalid.
func (c ConcurrencyConfig) Resolved() (ConcurrencyConfig, error) {
	err := c.resolve()
	return c, err
}

func (c *ConcurrencyConfig) resolve() error {
	if len(c.Goroutines) == 0 {
		c.Goroutines = []int{1, 4, 16}
	}
	for _, g := range c.Goroutines {
		if g < 1 || g > 256 {
			return invalid("ConcurrencyConfig.Goroutines: %d: want 1 to 256", g)
		}
	}
	if err := checkSizes("ConcurrencyConfig.Sizes", &c.Sizes, []int64{1 << 20, 24 << 20}); err != nil {
		return err
	}
	if len(c.Dirs) == 0 {
		c.Dirs = []string{DirH2D, DirD2H}
	}
	if err := checkNames("ConcurrencyConfig.Dirs", &c.Dirs, []string{DirH2D, DirD2H}); err != nil {
		return err
	}
	if err := checkSamples("ConcurrencyConfig.Samples", &c.Samples, 5); err != nil {
		return err
	}
	switch {
	case c.MinBytes == 0:
		c.MinBytes = 64 << 20
	case c.MinBytes < 0 || c.MinBytes > MaxSize:
		return invalid("ConcurrencyConfig.MinBytes %d: want 1 to %d (0: 64 MiB)", c.MinBytes, int64(MaxSize))
	}
	var total int64
	for _, g := range c.Goroutines {
		for _, n := range c.Sizes {
			total = max(total, int64(g)*n)
		}
	}
	if total > MaxSize {
		return invalid("ConcurrencyConfig: %s in all at once is more than %s", FormatSize(total), FormatSize(MaxSize))
	}
	return nil
}

// ConcurrencyDir is the Dir of a concurrency row: the direction and the
// number of goroutines, "h2d/16g".
func ConcurrencyDir(dir string, goroutines int) string {
	return dir + "/" + strconv.Itoa(goroutines) + "g"
}

// Concurrency measures many goroutines moving Go memory at once, each its
// own slice to its own device buffer: through one default Copier they all
// share (kind copier), against each calling the driver's synchronous
// pageable copy (kind pageable-sync). A sample is timed by the wall clock
// from the start of the first goroutine to the end of the last; the
// figure is the bytes of all goroutines over that time.
func (s *Session) Concurrency(ctx context.Context, cfg ConcurrencyConfig) ([]Result, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	maxG, maxN := 0, int64(0)
	for _, g := range cfg.Goroutines {
		maxG = max(maxG, g)
	}
	for _, n := range cfg.Sizes {
		maxN = max(maxN, n)
	}
	devs := make([]*cuda.DeviceBuffer, 0, maxG)
	hosts := make([][]byte, maxG)
	defer func() {
		for _, d := range devs {
			_ = d.Free()
		}
	}()
	for i := range maxG {
		d, err := s.Ctx.Alloc(int(maxN))
		if err != nil {
			return nil, fmt.Errorf("bench: device buffer of %s: %w", FormatSize(maxN), err)
		}
		devs = append(devs, d)
		hosts[i] = randomBytes(int(maxN), uint64(i+10))
	}
	cp, err := transfer.New(s.Ctx)
	if err != nil {
		return nil, err
	}
	defer cp.Close(context.Background())
	var out []Result
	for _, kind := range concurrencyKinds {
		for _, d := range cfg.Dirs {
			for _, g := range cfg.Goroutines {
				for _, n := range cfg.Sizes {
					r, err := s.concurrent(ctx, cfg, cp, kind, d, g, int(n), devs, hosts)
					if err != nil && !isFatal(err) {
						r = skipped("concurrency", kind, ConcurrencyDir(d, g), n, GBps, "error: "+err.Error())
						err = nil
					}
					if err == nil || r.Samples > 0 {
						s.progress(r)
						out = append(out, r)
					}
					if err != nil {
						return out, err
					}
				}
			}
		}
	}
	return out, nil
}

func (s *Session) concurrent(ctx context.Context, cfg ConcurrencyConfig, cp *transfer.Copier, kind, dir string, g, n int, devs []*cuda.DeviceBuffer, hosts [][]byte) (Result, error) {
	r := Result{Bench: "concurrency", Kind: kind, Dir: ConcurrencyDir(dir, g), Size: int64(n), Unit: GBps, Timing: TimingWall}
	rowStart := time.Now()
	c := &concurrentCopies{ctx: ctx, cp: cp, kind: kind, dir: dir, n: n, devs: devs[:g], hosts: hosts[:g]}
	c.reps = int(min(max((cfg.MinBytes+int64(g*n)-1)/int64(g*n), 1), 64))
	c.want = make([][]byte, g)
	for i := range g {
		c.want[i] = append([]byte(nil), hosts[i][:n]...)
	}
	if err := c.prepare(); err != nil {
		return r, err
	}
	if _, err := c.sample(); err != nil { // warm-up
		return r, err
	}
	var vals []float64
	var notes []string
	var stopErr error
	for i := range cfg.Samples {
		if stopErr = ctx.Err(); stopErr != nil {
			notes = append(notes, stoppedNote(i, cfg.Samples))
			break
		}
		if note, ok := s.budgetSpent(i, cfg.Samples, rowStart); ok {
			notes = append(notes, note)
			break
		}
		if i == 0 {
			if err := c.prepare(); err != nil {
				return r, err
			}
		}
		d, err := c.sample()
		if err != nil {
			return r, err
		}
		if i == 0 {
			if err := c.verify(); err != nil {
				notes = append(notes, verifyFailedMark+": "+err.Error())
			} else {
				r.Verified = true
			}
		}
		vals = append(vals, Rate(int64(g)*int64(n)*int64(c.reps), d))
	}
	r.fill(vals)
	what := "each goroutine calls the driver's synchronous pageable copy"
	if kind == KindCopier {
		what = "every goroutine shares one default transfer.Copier"
	}
	notes = append(notes, fmt.Sprintf("%d goroutines, %s each, %d copies each per sample; %s", g, FormatSize(int64(n)), c.reps, what))
	r.Note = strings.Join(notes, "; ")
	return r, stopErr
}

// concurrentCopies is one measurement of concurrent: a goroutine per
// device buffer copying n bytes between it and its host slice, reps times
// a sample, by the Copier or the driver's synchronous copy (kind).
type concurrentCopies struct {
	ctx         context.Context
	cp          *transfer.Copier
	kind, dir   string
	n, reps     int
	devs        []*cuda.DeviceBuffer
	hosts, want [][]byte
}

// one makes goroutine i's copy.
func (c *concurrentCopies) one(i int) error {
	h := c.hosts[i][:c.n]
	if c.kind != KindCopier {
		if c.dir == DirH2D {
			_, err := c.devs[i].WriteAt(h, 0)
			return err
		}
		_, err := c.devs[i].ReadAt(h, 0)
		return err
	}
	dv, err := c.devs[i].Slice(0, c.n)
	if err != nil {
		return err
	}
	if c.dir == DirH2D {
		_, err = c.cp.HtoD(c.ctx, dv, h)
	} else {
		_, err = c.cp.DtoH(c.ctx, h, dv)
	}
	return err
}

// sample runs every goroutine's reps copies at once and returns the time
// until the last is done.
func (c *concurrentCopies) sample() (time.Duration, error) {
	errs := make([]error, len(c.devs))
	var wg sync.WaitGroup
	start := time.Now()
	for i := range c.devs {
		wg.Go(func() {
			for range c.reps {
				if errs[i] = c.one(i); errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

// prepare poisons every destination and puts the wanted bytes in every
// source.
func (c *concurrentCopies) prepare() error {
	for i, dev := range c.devs {
		if c.dir == DirH2D {
			if err := memsetPrefix(dev, poisonDevice, c.n); err != nil {
				return err
			}
			continue
		}
		if _, err := dev.WriteAt(c.want[i], 0); err != nil {
			return err
		}
		poison(c.hosts[i][:c.n], poisonHost)
	}
	return nil
}

// verify checks that every destination holds the wanted bytes.
func (c *concurrentCopies) verify() error {
	got := make([]byte, c.n)
	for i, dev := range c.devs {
		if c.dir == DirH2D {
			if _, err := dev.ReadAt(got, 0); err != nil {
				return err
			}
		} else {
			got = c.hosts[i][:c.n]
		}
		if j := firstDiff(got, c.want[i]); j >= 0 {
			return fmt.Errorf("goroutine %d: byte %d is %#x, want %#x", i, j, got[j], c.want[i][j])
		}
	}
	return nil
}
