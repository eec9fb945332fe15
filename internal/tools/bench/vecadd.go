package bench

import (
	"context"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
)

// vecAdd measures a vector-add scenario end to end with the wall clock:
// two vectors of n bytes to the device, a light kernel, one vector back;
// with pageable memory and synchronous copies, then with pinned memory and
// asynchronous copies on one stream. It shows what pinning buys a small
// program that does nothing but copy and compute in turn.
func (s *Session) vecAdd(ctx context.Context, n, samples int) ([]Result, error) {
	a, b := randomBytes(n, 21), randomBytes(n, 22)
	want := append([]byte(nil), a...)
	noKernel := s.kernErr != nil
	if !noKernel {
		kernels.AddBytes(want, pipelineDelta)
	}
	da, err := s.Ctx.Alloc(n)
	if err != nil {
		return nil, err
	}
	defer da.Free()
	db, err := s.Ctx.Alloc(n)
	if err != nil {
		return nil, err
	}
	defer db.Free()
	st, err := s.Ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		return nil, err
	}
	defer st.Destroy()
	grid, block := s.grid()
	// The pageable run launches on the legacy default stream, where the
	// synchronous copies run: a pageable cuMemcpyHtoD may return before its
	// last DMA lands, and only legacy-stream work is ordered after it.
	legacy := cuda.WrapStream(s.Ctx, 0)
	kernel := func(st *cuda.Stream) error {
		if noKernel {
			return nil
		}
		return s.fns[kernels.KernelAdd].Launch(st, grid, block, 0, da.Ptr(), uint64(n), uint8(pipelineDelta))
	}
	note := "H2D a and b, add_u8 on a (light kernel), D2H a"
	if noKernel {
		note = "H2D a and b, D2H a, no kernel (kernels unavailable)"
	}
	run := func(kind string, ha, hb, hc []byte, async bool) (Result, error) {
		r := Result{Bench: "vecadd", Kind: kind, Dir: "e2e", Size: int64(3 * n), Unit: Ms, Timing: TimingWall, Note: note}
		copy(ha, a)
		copy(hb, b)
		var vals []float64
		for i := range samples + 1 {
			if err := ctx.Err(); err != nil {
				return r, err
			}
			poison(hc, poisonHost)
			start := time.Now()
			var err error
			if async {
				err = firstErr(st.CopyHtoD(da, 0, ha), st.CopyHtoD(db, 0, hb), kernel(st), st.CopyDtoH(hc, da, 0), st.Synchronize(context.Background()))
			} else {
				err = firstErr(errOf(da.WriteAt(ha, 0)), errOf(db.WriteAt(hb, 0)), kernel(legacy), errOf(da.ReadAt(hc, 0)))
			}
			d := time.Since(start)
			if err != nil {
				return r, err
			}
			if i == 1 {
				r.Verified = firstDiff(hc, want) < 0
			}
			if i > 0 {
				vals = append(vals, Millis(d))
			}
		}
		r.fill(vals)
		if !r.Verified {
			r.Note = verifyFailedMark + "; " + r.Note
		}
		return r, nil
	}
	var out []Result
	r, err := run(KindPageable, make([]byte, n), make([]byte, n), make([]byte, n), false)
	if err != nil {
		return out, err
	}
	out = append(out, r)
	var bufs []*pinmem.Buffer
	defer func() {
		for _, b := range bufs {
			_ = b.Free()
		}
	}()
	for range 3 {
		b, err := pinmem.Alloc(n, 0, pinmem.WithDevice(s.Dev), pinmem.WithMethod(pinmem.MethodHostAlloc))
		if err != nil {
			out = append(out, skipped("vecadd", KindPinned, "e2e", int64(3*n), Ms, err.Error()))
			return out, nil
		}
		bufs = append(bufs, b)
	}
	r, err = run(KindPinned, bufs[0].Bytes(), bufs[1].Bytes(), bufs[2].Bytes(), true)
	if err != nil {
		return out, err
	}
	return append(out, r), nil
}

// firstErr returns the first non-nil error. Its arguments are evaluated
// in order by the caller, so use it only where every call may run.
// errOf returns the error of an io call (ReadAt, WriteAt).
func errOf(_ int, err error) error { return err }

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
