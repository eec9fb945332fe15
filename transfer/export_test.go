package transfer

import "github.com/pinmem/pinmem/cuda"

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
