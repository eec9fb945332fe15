package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// Pinning methods of the pin bench.
const (
	PinHostAlloc      = "hostalloc"       // pinmem.Alloc with MethodHostAlloc (cuMemHostAlloc / cuMemFreeHost)
	PinMmapRegister   = "mmap-register"   // pinmem.Alloc with MethodMmapRegister (mmap, parallel touch, cuMemHostRegister)
	PinGoRegister     = "go-register"     // pinmem.Register of an already-touched Go slice (cuMemHostRegister)
	PinMallocRegister = "malloc+register" // PyTorch-like: allocate, pre-fault in parallel, register, all timed
)

// Operations (the Dir column) of the pin bench.
const (
	OpPin   = "pin"   // obtaining pinned memory
	OpUnpin = "unpin" // releasing it
	OpTouch = "touch" // allocating a Go slice and writing every page on one goroutine (malloc + memset)
)

// AllPinMethods returns every pinning method, in report order.
func AllPinMethods() []string {
	return []string{PinHostAlloc, PinMmapRegister, PinGoRegister, PinMallocRegister}
}

// DefaultPinSizes are the pin bench's default sizes: from a small buffer,
// where the driver call's fixed cost dominates, to 4 GiB, where the cost per
// page does.
var DefaultPinSizes = []int64{1 << 20, 64 << 20, 1 << 30, 4 << 30}

// PinConfig configures Session.Pin. Zero fields take their defaults;
// out-of-range fields make Pin fail with ErrInvalid.
type PinConfig struct {
	Methods []string `json:"methods"`     // pinning methods (AllPinMethods; empty: every method)
	Sizes   []int64  `json:"sizes_bytes"` // bytes per buffer, 1 to MaxSize (empty: DefaultPinSizes)
	Samples int      `json:"samples"`     // timed samples per measurement, up to MaxSamples (0: 3)
}

// Validate reports the first field of c that Pin would refuse, as an
// error matching ErrInvalid; c is not changed. Pin validates its
// configuration itself: calling Validate first finds the error before any
// GPU work (the CLI checks its flags this way).
func (c PinConfig) Validate() error { return c.resolve() }

// Resolved returns c with its defaults filled in, as the measurement uses
// it (reports record it), or the error Validate gives.
func (c PinConfig) Resolved() (PinConfig, error) {
	err := c.resolve()
	return c, err
}

// resolve fills in the defaults of c's zero fields and checks the others.
func (c *PinConfig) resolve() error {
	if err := checkNames("PinConfig.Methods", &c.Methods, AllPinMethods()); err != nil {
		return err
	}
	if err := checkSizes("PinConfig.Sizes", &c.Sizes, DefaultPinSizes); err != nil {
		return err
	}
	return checkSamples("PinConfig.Samples", &c.Samples, 3)
}

// ParsePinMethods parses a comma-separated list of pinning methods ("all"
// for every one).
func ParsePinMethods(s string) ([]string, error) {
	al := map[string]string{
		"hostalloc": PinHostAlloc, "mmap-register": PinMmapRegister, "mmap": PinMmapRegister,
		"mmap-registered": PinMmapRegister, "registered-mmap": PinMmapRegister, "go-registered": PinGoRegister,
		"go-register": PinGoRegister, "register": PinGoRegister, "go": PinGoRegister,
		"malloc+register": PinMallocRegister, "pytorch": PinMallocRegister, "malloc-register": PinMallocRegister,
	}
	return parseList(s, "pinning method", al, AllPinMethods())
}

// Pin measures, with the wall clock, what it costs to pin and unpin host
// memory with each method and size. Each sample's memory is checked with a
// round trip through the device before it is released. Sizes the budget
// or the host refuse give skipped results. ctx is checked before each
// sample (see Session).
func (s *Session) Pin(ctx context.Context, cfg PinConfig) ([]Result, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	probe, err := s.Ctx.Alloc(1 << 20)
	if err != nil {
		return nil, err
	}
	defer probe.Free()
	var out []Result
	for _, m := range cfg.Methods {
		for _, n := range cfg.Sizes {
			rs, err := s.pinOne(ctx, m, int(n), cfg.Samples, probe)
			for _, r := range rs {
				s.progress(r)
			}
			out = append(out, rs...)
			if err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// pinOne measures one method and size. When ctx ends the run, the samples
// taken so far are returned as results (none if there were none) with
// ctx's error.
func (s *Session) pinOne(ctx context.Context, method string, n, samples int, probe *cuda.DeviceBuffer) ([]Result, error) {
	p := &pinRun{method: method, n: n, dev: pinmem.WithDevice(s.Dev), threads: runtime.NumCPU(), vals: map[string][]float64{}}
	p.ops = []string{OpPin, OpUnpin}
	if method == PinGoRegister {
		p.ops = []string{OpTouch, OpPin, OpUnpin}
	}
	known := slices.Contains(AllPinMethods(), method)
	var stopErr error
	done := 0
	for i := 0; i < samples; i++ {
		if stopErr = ctx.Err(); stopErr != nil {
			if i == 0 {
				return nil, stopErr
			}
			break
		}
		if !known {
			return nil, invalid("unknown pinning method %q", method)
		}
		buf, pinT, err := p.pin()
		if err != nil {
			return p.failed(err), nil
		}
		p.vals[OpPin] = append(p.vals[OpPin], Millis(pinT))
		if i == 0 {
			p.verr = roundTrip(s.Ctx, buf.Bytes(), probe)
		}
		start := time.Now()
		err = buf.Free()
		p.vals[OpUnpin] = append(p.vals[OpUnpin], Millis(time.Since(start)))
		if err != nil {
			return p.failed(err), err
		}
		if method == PinGoRegister || method == PinMallocRegister {
			debug.FreeOSMemory() // the next sample gets fresh pages, as malloc would
		}
		done++
	}
	rs := p.results()
	if stopErr != nil {
		for i := range rs {
			rs[i].Note = joinNotes([]string{rs[i].Note, stoppedNote(done, samples)})
		}
	}
	return rs, stopErr
}

// pinRun is the measurement of one pinning method and size: the times of
// each operation (ops) so far and the round trip's failure, if any.
type pinRun struct {
	method  string
	n       int
	dev     pinmem.Option
	threads int // goroutines pre-faulting for PinMallocRegister
	ops     []string
	vals    map[string][]float64
	verr    error
}

// pin pins n bytes by the method and returns the buffer and the time it
// took; for PinGoRegister it records the time to touch the pages apart.
func (p *pinRun) pin() (*pinmem.Buffer, time.Duration, error) {
	var buf *pinmem.Buffer
	var err error
	start := time.Now()
	switch p.method {
	case PinHostAlloc:
		buf, err = pinmem.Alloc(p.n, 0, p.dev, pinmem.WithMethod(pinmem.MethodHostAlloc))
	case PinMmapRegister:
		buf, err = pinmem.Alloc(p.n, 0, p.dev, pinmem.WithMethod(pinmem.MethodMmapRegister))
	case PinGoRegister:
		heap := make([]byte, p.n)
		touch(heap, 1)
		p.vals[OpTouch] = append(p.vals[OpTouch], Millis(time.Since(start)))
		start = time.Now()
		buf, err = pinmem.Register(heap, 0, p.dev)
	default: // PinMallocRegister
		heap := make([]byte, p.n)
		touch(heap, p.threads)
		buf, err = pinmem.Register(heap, 0, p.dev)
	}
	return buf, time.Since(start), err
}

// failed returns every operation's result, skipped for err.
func (p *pinRun) failed(err error) []Result {
	var rs []Result
	for _, op := range p.ops {
		rs = append(rs, skipped("pin", p.method, op, int64(p.n), Ms, err.Error()))
	}
	return rs
}

// results returns every operation's result from the samples taken.
func (p *pinRun) results() []Result {
	var rs []Result
	for _, op := range p.ops {
		r := Result{Bench: "pin", Kind: p.method, Dir: op, Size: int64(p.n), Unit: Ms, Timing: TimingWall, Verified: p.verr == nil}
		r.fill(p.vals[op])
		switch {
		case op == OpTouch:
			r.Note = "make + write every page on one goroutine (malloc + memset)"
		case op == OpPin && p.method == PinMallocRegister:
			r.Note = fmt.Sprintf("make + pre-fault on %d goroutines + cuMemHostRegister (PyTorch-like)", p.threads)
		case op == OpPin && p.method == PinGoRegister:
			r.Note = "cuMemHostRegister of touched memory"
		}
		if p.verr != nil {
			r.Note = joinNotes([]string{verifyFailedMark + ": " + p.verr.Error(), r.Note})
		}
		rs = append(rs, r)
	}
	return rs
}

// touch writes one byte in every page of b, spread over the given number
// of goroutines.
func touch(b []byte, threads int) {
	page := os.Getpagesize()
	pages := (len(b) + page - 1) / page
	threads = max(1, min(threads, pages))
	var wg sync.WaitGroup
	per := (pages + threads - 1) / threads
	for t := range threads {
		lo, hi := t*per, min((t+1)*per, pages)
		if lo >= hi {
			break
		}
		wg.Go(func() {
			for p := lo; p < hi; p++ {
				b[p*page] = 1
			}
		})
	}
	wg.Wait()
}

// roundTrip checks that pinned memory moves through the device: random
// data at its start and end goes to probe and back.
func roundTrip(ctx *cuda.Context, b []byte, probe *cuda.DeviceBuffer) error {
	n := min(len(b)/2, probe.Size()/2, 64<<10)
	if n == 0 {
		return nil
	}
	for _, off := range []int{0, len(b) - n} {
		want := randomBytes(n, uint64(off)+7)
		copy(b[off:off+n], want)
		if _, err := probe.WriteAt(b[off:off+n], 0); err != nil {
			return err
		}
		poison(b[off:off+n], poisonHost)
		if _, err := probe.ReadAt(b[off:off+n], 0); err != nil {
			return err
		}
		if i := firstDiff(b[off:off+n], want); i >= 0 {
			return fmt.Errorf("byte %d of a round trip through the device differs", off+i)
		}
	}
	return nil
}
