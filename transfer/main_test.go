package transfer

import (
	"testing"

	"github.com/pinmem/pinmem/cuda"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

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
