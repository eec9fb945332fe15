package main

import (
	"bytes"
	"io"
	"os"
	"sync"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"
)

// progress shows how far a long run is: a bar with the count of finished
// measurements and an estimate of the time left, on standard error when it
// is a terminal. It is silent when stderr is not a terminal or with --quiet.
// The bench package writes one line per finished measurement to it.
type progress struct {
	mu    sync.Mutex
	p     *mpb.Progress
	bar   *mpb.Bar
	total int64
	n     int64
	last  []byte
}

// isTerminal reports whether w is a terminal (a test hook).
var isTerminal = func(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// newProgress returns a progress bar for about total measurements on
// stderr, or nil (no progress) when quiet or stderr is not a terminal.
func newProgress(stderr io.Writer, quiet bool, total int, what string) *progress {
	if quiet || !isTerminal(stderr) {
		return nil
	}
	return newProgressAlways(stderr, total, what)
}

// newProgressAlways draws a bar on stderr whether or not it is a terminal.
func newProgressAlways(stderr io.Writer, total int, what string) *progress {
	p := mpb.New(mpb.WithOutput(stderr), mpb.WithWidth(40), mpb.WithAutoRefresh())
	pr := &progress{p: p, total: int64(max(total, 1))}
	pr.bar = p.AddBar(pr.total,
		mpb.PrependDecorators(decor.Name(what+" ", decor.WCSyncSpaceR), decor.CountersNoUnit("%d/%d", decor.WCSyncWidth)),
		mpb.AppendDecorators(decor.Name(" left "), decor.AverageETA(decor.ET_STYLE_GO)),
	)
	return pr
}

// Write counts the finished measurements, one per line.
func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = append(p.last, b...)
	for {
		i := bytes.IndexByte(p.last, '\n')
		if i < 0 {
			break
		}
		p.last = p.last[i+1:]
		p.n++
		if p.n > p.total {
			// The estimate was short: grow it with the count.
			p.total = p.n
			p.bar.SetTotal(p.total, false)
		}
		p.bar.Increment()
	}
	return len(b), nil
}

// writer returns p as an io.Writer, or nil for no progress.
func (p *progress) writer() io.Writer {
	if p == nil {
		return nil
	}
	return p
}

// done completes the bar and waits for its last render.
func (p *progress) done() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.bar.SetTotal(p.n, true)
	p.mu.Unlock()
	p.p.Wait()
}
