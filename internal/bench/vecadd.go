package bench

import (
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
)

// vecAdd re-measures the seed's vector-add scenario end to end with the
// wall clock: two vectors of n bytes to the device, a light kernel,
// one vector back; with pageable memory and synchronous copies, then with
// pinned memory and asynchronous copies on one stream. The seed reports
// 15 ms pageable and 8 ms pinned.
func (s *Session) vecAdd(n, samples int) ([]Result, error) {
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
	// The pageable run launches on the legacy default stream, like the
	// seed's synchronous copies: a pageable cuMemcpyHtoD may return before
	// its last DMA lands, and only legacy-stream work is ordered after it.
	legacy := cuda.WrapStream(s.Ctx, 0)
	kernel := func(st *cuda.Stream) error {
		if noKernel {
			return nil
		}
		return s.fns[kernels.KernelAdd].Launch(st, grid, block, 0, da.Ptr(), uint64(n), uint8(pipelineDelta))
	}
	note := "H2D a and b, add_u8 on a (light kernel), D2H a; seed: pageable 15 ms -> pinned 8 ms"
	if noKernel {
		note = "H2D a and b, D2H a, no kernel (kernels unavailable); seed: pageable 15 ms -> pinned 8 ms"
	}
	run := func(kind string, ha, hb, hc []byte, async bool) (Result, error) {
		r := Result{Bench: "vecadd", Kind: kind, Dir: "e2e", Size: int64(3 * n), Unit: Ms, Timing: TimingWall, Note: note}
		copy(ha, a)
		copy(hb, b)
		var vals []float64
		for i := range samples + 1 {
			poison(hc, poisonHost)
			start := time.Now()
			var err error
			if async {
				err = firstErr(st.CopyHtoD(da.Ptr(), ha), st.CopyHtoD(db.Ptr(), hb), kernel(st), st.CopyDtoH(hc, da.Ptr()), st.Synchronize())
			} else {
				err = firstErr(da.Write(0, ha), db.Write(0, hb), kernel(legacy), da.Read(0, hc))
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
			r.Note = "VERIFY FAILED; " + r.Note
		}
		return r, nil
	}
	var out []Result
	r, err := run(KindPageable, make([]byte, n), make([]byte, n), make([]byte, n), false)
	out = append(out, r)
	if err != nil {
		return out, err
	}
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
	out = append(out, r)
	return out, err
}

// firstErr returns the first non-nil error. Its arguments are evaluated
// in order by the caller, so use it only where every call may run.
func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
