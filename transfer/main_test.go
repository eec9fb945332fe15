package transfer

import (
	"context"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// checkPinsOnUse checks what a default Copier pins as it is used, on the
// fake driver or a GPU: nothing in New; one small stage (1 MiB) after a
// 4 KiB round trip, and nothing more after a second; with large, the
// small stage and one ring after a 256 MiB round trip. alloc returns a
// device buffer of n bytes; every byte of each round trip is checked. It
// returns the Copier and the bytes pinned since before New.
func checkPinsOnUse(t *testing.T, newCopier func() *Copier, alloc func(n int) *cuda.DeviceBuffer, large bool) (*Copier, func() int64) {
	t.Helper()
	base := pinmem.Stats().Pinned.Bytes
	pinned := func() int64 { return pinmem.Stats().Pinned.Bytes - base }
	c := newCopier()
	if p := pinned(); p != 0 {
		t.Fatalf("New pinned %d bytes, want 0", p)
	}
	roundTrip := func(n int) {
		t.Helper()
		dev := alloc(n)
		src := testutil.RandomBytes(n, uint64(n))
		dst := make([]byte, n)
		if _, err := c.HtoD(context.Background(), dev, src); err != nil {
			t.Fatal(err)
		}
		if _, err := c.DtoH(context.Background(), dst, dev); err != nil {
			t.Fatal(err)
		}
		testutil.CheckBytes(t, src, dst)
	}
	for i := range 2 {
		roundTrip(4 << 10)
		if p := pinned(); p != smallStageSize || p > 1<<20 {
			t.Fatalf("after 4 KiB round trip %d: %d bytes pinned, want one small stage of %d (at most 1 MiB)", i+1, p, smallStageSize)
		}
	}
	if large {
		roundTrip(256 << 20)
		if p, want := pinned(), int64(smallStageSize+DefaultDepth*DefaultStageSize); p != want {
			t.Errorf("after a 256 MiB round trip: %d bytes pinned, want %d (the small stage and one ring)", p, want)
		}
	}
	return c, pinned
}

// pipelineCfg gathers a Pipeline's options in one literal, for tables.
type pipelineCfg struct {
	ChunkSize, Streams, InFlight int
	Ordered, PinStages           bool
	Work                         func(s *cuda.Stream, ch Chunk) error
	Done                         func(ch Chunk) error
}

// opts returns the options the set fields ask for.
func (c pipelineCfg) opts() []PipelineOption {
	var o []PipelineOption
	if c.ChunkSize != 0 {
		o = append(o, WithChunkSize(c.ChunkSize))
	}
	if c.Streams != 0 {
		o = append(o, WithStreams(c.Streams))
	}
	if c.InFlight != 0 {
		o = append(o, WithInFlight(c.InFlight))
	}
	if c.Ordered {
		o = append(o, WithOrdered(true))
	}
	if c.PinStages {
		o = append(o, WithPinStages(true))
	}
	if c.Work != nil {
		o = append(o, WithWork(c.Work))
	}
	if c.Done != nil {
		o = append(o, WithDone(c.Done))
	}
	return o
}

func newTestPipeline(c *Copier, cfg pipelineCfg) (*Pipeline, error) {
	return c.NewPipeline(cfg.opts()...)
}
