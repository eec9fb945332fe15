package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/copypool"
	"github.com/pinmem/pinmem/transfer"
)

// KindStagedBound is the bound of a Copier moving Go memory one way
// through its pinned stages, measured in the same run (copierPaired): the
// CPU's parallel copy between the Go slice and pinned memory (with the
// Copier's goroutines) and the copy engine's copy between that pinned
// memory and the device, of the same size, started together, as a staged
// copy runs them; the rate is the bytes over the time both took. The two
// share the host's memory bandwidth, so the bound is at most the smaller of
// their rates apart (which the row's note gives too).
const KindStagedBound = KindImageStagedBound

// stagedBoundMin is the smallest size at which a copier row has a
// staged-bound row: below it a default Copier does not stage a transfer
// over its parallel copy goroutines.
const stagedBoundMin = 16 << 20

// PairedTiming says how the copier rows of one direction are timed
// against the driver's synchronous copy of the same slice, as
// BenchmarkCopierVsDriver (package transfer) times them too.
const PairedTiming = "paired rounds: in each sample, in a random order, each variant's one untimed call and then the sample's copies back to back, by the wall clock; the ratio is the median of the samples' ratios"

// copierPaired measures a Copier moving n bytes of the Go slice of hA in
// direction dir (h2d or d2h) side by side with the driver's synchronous
// copy of the same slice (KindPageableSync's copy): cfg.Samples rounds,
// each running, in a random order, one untimed call and then reps timed
// calls of every variant (PairedTiming). The row's Ref is pageable-sync
// and its Ratio the median of the rounds' ratios (Paired), so that drift
// of the host between rows does not enter it. From stagedBoundMin up the
// rounds also time the parts of the staged bound, and the run reports it
// as a KindStagedBound row (see Session.Bandwidth), with the
// copier's paired ratio to it in the copier row's note.
func (w *bwWork) copierPaired(kind string, hA *hostMem, dir string, n int, ops dirOps) (Result, error) {
	r := Result{Bench: "bw", Kind: kind, Dir: dir, Size: int64(n), Unit: GBps, Timing: TimingWall}
	copierOp, driverOp := ops.h2d, func() error { _, err := w.devA.WriteAt(hA.b[:n], 0); return err }
	if dir == DirD2H {
		copierOp, driverOp = ops.d2h, func() error { _, err := w.devA.ReadAt(hA.b[:n], 0); return err }
	}
	variants := []func() error{copierOp, driverOp}
	var boundErr error
	bound := n >= stagedBoundMin
	if bound {
		// The copier first pins what it needs (one call), so that the
		// bound's buffers never take the budget from the row it bounds.
		if err := copierOp(); err != nil {
			return r, err
		}
		if boundErr = w.boundMem(n); boundErr == nil {
			variants = append(variants, w.boundVariants(hA, dir, n)...)
		}
		bound = boundErr == nil
	}
	p := w.plan(KindPageable, hA, nil, dir, n) // the data, and its check
	if err := p.prepare(); err != nil {
		return r, err
	}
	reps := w.cfg.reps(int64(n))
	rates, notes, stopErr, err := w.pairedRounds(variants, n, reps)
	if err != nil {
		return r, err
	}
	if boundErr != nil {
		notes = append(notes, "no staged-bound row: "+boundErr.Error())
	}
	r.fill(rates[0])
	// The check: one more copier call on fresh data.
	if len(rates[0]) > 0 {
		if err := pairedCheck(p, copierOp); err != nil {
			notes = append(notes, verifyFailedMark+": "+err.Error())
		} else {
			r.Verified = true
		}
	}
	if x := pairedRatios(rates[0], rates[1]); x > 0 {
		r.Ref, r.Ratio, r.Paired = KindPageableSync, x, true
		notes = append(notes, fmt.Sprintf("paired with the driver's synchronous copy of the same slice (%s GB/s): %.2fx", formatValue(Summarize(rates[1]).Median), x))
	}
	if bound && len(rates[0]) > 0 {
		notes = append(notes, w.stagedBound(rates, hA, dir, n, variants[4]))
	}
	notes = append(notes, PairedTiming)
	if reps > 1 {
		notes = append(notes, fmt.Sprintf("%d copies per sample", reps))
	}
	r.Note = joinNotes(notes)
	return r, stopErr
}

// boundVariants returns the staged bound's variants for n bytes of the Go
// slice of hA in direction dir, copierPaired's third to fifth: the CPU's
// copy between the slice and pinned memory, the copy engine's copy between
// other pinned memory and the device, and the two started together (the
// bound: the copy engine's on a goroutine of its own, the CPU's on the
// caller's, as in a Copier whose CPU fills one stage while the copy engine
// reads another), ending when both have.
func (w *bwWork) boundVariants(hA *hostMem, dir string, n int) []func() error {
	workers := min(transfer.DefaultParallelism, runtime.NumCPU())
	pin := w.pinned[0].Bytes()[:n]
	memcpy := func() error { w.pool.Copy(workers, 4, pin, hA.b[:n]); return nil }
	dma := func() error { return w.pinnedCopy(w.pinned[1], n, true) }
	if dir == DirD2H {
		memcpy = func() error { w.pool.Copy(workers, 4, hA.b[:n], pin); return nil }
		dma = func() error { return w.pinnedCopy(w.pinned[1], n, false) }
	}
	both := func() error {
		errc := make(chan error, 1)
		go func() { errc <- dma() }()
		err := memcpy()
		return errors.Join(err, <-errc)
	}
	return []func() error{memcpy, dma, both}
}

// pairedRounds runs copierPaired's warm-up calls and then its rounds of
// n-byte variants, reps timed calls each, and returns every variant's rates
// by round, the notes of a round cut short (by the context, stopErr, or
// the time budget), and the error of a failed call.
func (w *bwWork) pairedRounds(variants []func() error, n, reps int) (rates [][]float64, notes []string, stopErr, err error) {
	rowStart := time.Now()
	order := rand.New(rand.NewPCG(uint64(n), 0x9a1d))
	rates = make([][]float64, len(variants))
	for range max(0, w.cfg.Warmup) {
		for _, v := range variants {
			if err := v(); err != nil {
				return nil, nil, nil, err
			}
		}
	}
	for i := range w.cfg.Samples {
		if stopErr = w.ctx.Err(); stopErr != nil {
			notes = append(notes, stoppedNote(i, w.cfg.Samples))
			break
		}
		if note, ok := w.s.budgetSpent(i, w.cfg.Samples, rowStart); ok {
			notes = append(notes, note)
			break
		}
		for _, k := range order.Perm(len(variants)) {
			if err := variants[k](); err != nil { // untimed: no variant inherits its predecessor's state
				return nil, nil, nil, err
			}
			t0 := time.Now()
			for range reps {
				if err := variants[k](); err != nil {
					return nil, nil, nil, err
				}
			}
			rates[k] = append(rates[k], Rate(int64(n)*int64(reps), time.Since(t0)))
		}
	}
	return rates, notes, stopErr, nil
}

// pairedCheck prepares fresh data, makes one more copier call and verifies
// what it moved, returning the first error.
func pairedCheck(p bwPlan, copierOp func() error) error {
	err := p.prepare()
	if err == nil {
		err = copierOp()
	}
	if err == nil {
		err = p.verify(1)
	}
	return err
}

// stagedBound adds to w.bounds the KindStagedBound row of n bytes in
// direction dir, the rates of the bound's variant that runs its two copies
// together (rates[4]), with the rates of each copy alone (rates[2] and
// rates[3]) in its note, verified by one more call of that variant, both
// (boundCheck, hA's slice);
// it returns the copier row's note of its paired ratio to that row.
func (w *bwWork) stagedBound(rates [][]float64, hA *hostMem, dir string, n int, both func() error) string {
	b := Result{Bench: "bw", Kind: KindStagedBound, Dir: dir, Size: int64(n), Unit: GBps, Timing: TimingWall}
	b.fill(rates[4])
	var verr error
	if b.Verified, verr = true, w.boundCheck(hA, dir, n, both); verr != nil {
		b.Verified = false
	}
	b.Note = fmt.Sprintf("the CPU's copy %s with %d goroutines and the copy engine's %s of other pinned memory, started together and timed until both end, in the copier's rounds; each alone: %s and %s GB/s",
		map[string]string{DirH2D: "from the Go slice into pinned memory", DirD2H: "from pinned memory into the Go slice"}[dir],
		min(transfer.DefaultParallelism, runtime.NumCPU()),
		map[string]string{DirH2D: "pinned-to-device copy", DirD2H: "device-to-pinned copy"}[dir],
		formatValue(Summarize(rates[2]).Median), formatValue(Summarize(rates[3]).Median))
	if verr != nil {
		b.Note = joinNotes([]string{verifyFailedMark + ": " + verr.Error(), b.Note})
	}
	w.bounds = append(w.bounds, b)
	return fmt.Sprintf("%.2f of %s (paired)", pairedRatios(rates[0], rates[4]), KindStagedBound)
}

// pairedRatios is the median over the samples of a[i]/b[i] (0 when there
// is none): samples of one round ran side by side, so their ratio leaves
// out the host's drift from one round to the next.
func pairedRatios(a, b []float64) float64 {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	if len(rs) == 0 {
		return 0
	}
	return Summarize(rs).Median
}

// boundMem makes what the staged bound of n bytes needs: two pinned
// buffers of at least n bytes (pinned again when a row needs more, so that
// the budget holds no more than the row needs) and a copy pool as the
// Copier's. An error leaves the bound out of the row.
func (w *bwWork) boundMem(n int) error {
	for i, p := range w.pinned {
		if p != nil && len(p.Bytes()) >= n {
			continue
		}
		if p != nil {
			w.pinned[i] = nil
			if err := p.Free(); err != nil {
				return err
			}
		}
		var err error
		if w.pinned[i], err = pinmem.Alloc(n, 0, pinmem.WithDevice(w.s.Dev)); err != nil {
			return err
		}
	}
	if w.pool == nil {
		w.pool = copypool.New(min(transfer.DefaultParallelism, runtime.NumCPU())-1, false) // the caller copies too, as in a Copier
	}
	return nil
}

// boundCheck fills the sources of the bound's copies with fresh bytes and
// their destinations with others, runs both (the bound's variant) once
// more and checks what its two copies moved: the CPU's, between the Go
// slice and w.pinned[0], and the copy engine's, between w.pinned[1] and
// devA (read back through the driver). It leaves devA and the slice
// holding the bound's bytes: the next row prepares its own.
func (w *bwWork) boundCheck(hA *hostMem, dir string, n int, both func() error) error {
	cpuSrc, cpuDst := hA.b[:n], w.pinned[0].Bytes()[:n]
	if dir == DirD2H {
		cpuSrc, cpuDst = cpuDst, cpuSrc
	}
	copy(cpuSrc, w.expA[:n])
	copy(cpuDst, w.expB[:n]) // poison: a copy left out shows
	copy(w.pinned[1].Bytes()[:n], w.expB[:n])
	if _, err := w.devA.WriteAt(w.expA[:n], 0); err != nil {
		return err
	}
	if err := both(); err != nil {
		return err
	}
	if !bytes.Equal(cpuDst, w.expA[:n]) {
		return fmt.Errorf("the CPU's copy of %s: the destination differs from the source", FormatSize(int64(n)))
	}
	dev := w.scratch[:n]
	if _, err := w.devA.ReadAt(dev, 0); err != nil {
		return err
	}
	want := w.expB[:n] // host to device: pinned[1]'s bytes now on the device
	if dir == DirD2H {
		want = w.expA[:n] // device to host: the device's bytes now in pinned[1]
		if !bytes.Equal(w.pinned[1].Bytes()[:n], want) {
			return fmt.Errorf("the copy engine's copy of %s: pinned memory differs from the device", FormatSize(int64(n)))
		}
	}
	if !bytes.Equal(dev, want) {
		return fmt.Errorf("the copy engine's copy of %s: the device differs", FormatSize(int64(n)))
	}
	return nil
}

// pinnedCopy copies the first n bytes of buf (pinned) to or from the
// start of devA on stream A, one copy per registration, and waits.
func (w *bwWork) pinnedCopy(buf *pinmem.Buffer, n int, htod bool) error {
	off := 0
	for _, seg := range buf.Segments() {
		if off >= n {
			break
		}
		seg = seg[:min(len(seg), n-off)]
		var err error
		if htod {
			err = w.stA.CopyHtoD(w.devA, off, seg)
		} else {
			err = w.stA.CopyDtoH(seg, w.devA, off)
		}
		if err != nil {
			return err
		}
		off += len(seg)
	}
	return w.stA.Synchronize(context.Background())
}
