package transfer

import (
	"errors"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/lifecycle"
)

// stage is one pinned buffer of a staging engine, with the event recorded
// after the last copy out of it or into it.
type stage struct {
	buf   *pinmem.Buffer
	mem   []byte
	cuts  []int       // registration boundaries in mem (hostspan.Cuts)
	ev    *cuda.Event // recorded behind the copies on it (ring)
	small bool        // of the engine's small class
}

// copyStage copies between host memory and a stage, on the caller's
// goroutine when small, else with the engine's copy goroutines, and
// returns its CPU time with WithStats.
func (c *copier) copyStage(dst, src []byte) time.Duration {
	parts := c.o.parallelism
	if len(src) <= singleCopyInline {
		if !c.o.stats {
			copy(dst, src)
			return 0
		}
		parts = 1 // timed by the pool's clock
	}
	return c.eng.pool.Copy(parts, c.o.tune.subPieces, dst, src)
}

// free releases the stage, counting in left what the driver still holds.
func (s *stage) free(left *int) error {
	return errors.Join(freeBuf(&s.buf, left), destroyEvent(&s.ev, left))
}

// freeStages frees ss; what the driver fails to release is retried later.
func freeStages(ss []*stage) error {
	r := lifecycle.NewReleaser(func() (int, error) {
		left := 0
		var errs []error
		for _, s := range ss {
			errs = append(errs, s.free(&left))
		}
		return left, errors.Join(errs...)
	})
	err := r.Release()
	r.Orphan()
	return err
}
