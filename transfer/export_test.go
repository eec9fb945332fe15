package transfer

import (
	"context"
	"os"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/transfer/internal/regcache"
)

// copierStreams returns the streams c issues its copies on.
func copierStreams(c *Copier) []*cuda.Stream {
	var ss []*cuda.Stream
	for _, l := range c.lanes {
		ss = append(ss, l.stream)
	}
	return ss
}

// pipelineStreams returns the streams of p.
func pipelineStreams(p *Pipeline) []*cuda.Stream { return p.streams }

// multiStreams returns, for each device of m, the stream a Broadcast
// takes when the device's Copier is idle: its first lane's.
func multiStreams(m *Multi) []*cuda.Stream {
	var ss []*cuda.Stream
	for _, d := range m.devs {
		ss = append(ss, d.cp.lanes[0].stream)
	}
	return ss
}

// tune returns the tuning of c, for tests and benchmarks to vary (not
// while c is in use).
func (c *Copier) tune() *tuning { return &c.o.tune }

// StageSize returns the size of each staging buffer of c.
func (c *Copier) StageSize() int {
	if !c.ok() {
		return 0
	}
	return c.o.stageSize
}

// Context returns the Copier's CUDA context (nil for a nil Copier).
func (c *Copier) Context() *cuda.Context {
	if !c.ok() {
		return nil
	}
	return c.cctx
}

// Devices returns the number of contexts the Multi serves.
func (m *Multi) Devices() int {
	if !m.ok() {
		return 0
	}
	return len(m.devs)
}

// Cancel asks the transfer to stop: it stops issuing copies and finishes
// with an error matching context.Canceled (unless it had already
// finished). A nil Op is ignored.
func (t *Op) Cancel() {
	if t != nil {
		t.cancel()
	}
}

// pageSize is the host's page size, as the registration cache pins.
var pageSize = uintptr(os.Getpagesize())

// cacheView is a Copier's registration cache as the tests read it.
type cacheView struct{ c *regcache.Cache }

// Cache returns the registration cache, or nil when it is off.
func (c *Copier) Cache() *cacheView {
	if !c.ok() || c.cache == nil {
		return nil
	}
	return &cacheView{c.cache}
}

// Stats is Copier.CacheStats.
func (v *cacheView) Stats() CacheStats {
	if v == nil {
		return CacheStats{}
	}
	return CacheStats(v.c.Stats())
}

// Forget is Copier.Forget.
func (v *cacheView) Forget(p []byte) int64 {
	if v == nil {
		return 0
	}
	return v.c.Forget(p)
}

// reclaim is what pinmem's budget calls.
func (v *cacheView) reclaim(want int64) int64 {
	if v == nil {
		return 0
	}
	return v.c.Reclaim(want)
}

// Stream returns the stream of the Copier's first lane: the stream given
// by WithStream, else the first of the two streams the Copier issues its
// copies on (nil for a nil Copier). A transfer that returns without error
// has had all its copies run, whichever lane it took; after an error, a
// transfer's copies may sit on either lane: wait with Fence, not on this
// stream, before reusing pinned memory.
func (c *Copier) Stream() *cuda.Stream {
	if !c.ok() {
		return nil
	}
	return c.lanes[0].stream
}

// stageCount returns the stages the engine holds and the most borrowed at
// once so far.
func (e *engine) stageCount() (all, peak int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.ring.all), e.peak
}

// htod is HtoD with path forced by how.
func (c *copier) htod(ctx context.Context, dst *cuda.DeviceBuffer, src []byte, how strategy) (Stats, error) {
	st, _, err := c.move(ctx, HostToDevice, src, dst, how)
	return st, err
}

// dtoh is DtoH with path forced by how.
func (c *copier) dtoh(ctx context.Context, dst []byte, src *cuda.DeviceBuffer, how strategy) (Stats, error) {
	st, _, err := c.move(ctx, DeviceToHost, dst, src, how)
	return st, err
}

// String names the path in test messages.
func (p path) String() string {
	switch p {
	case pathRing:
		return "ring"
	case pathSmall:
		return "small stage"
	}
	return "stage"
}
