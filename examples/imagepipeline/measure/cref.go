package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pinmem/pinmem/examples/internal/harness"
)

// CRow is one result line of the C baseline (cref/imagepipeline.c): kind
// "naive" or "pinned" (Median, Min and Max in frames per second over
// Samples runs, Streams streams), or "bidir" (Median in GB/s of both
// directions' bytes).
type CRow struct {
	Bench    string  `json:"bench"`
	Kind     string  `json:"kind"`
	Width    int     `json:"width"`
	Height   int     `json:"height"`
	Streams  int     `json:"streams"`
	Samples  int     `json:"samples"`
	Median   float64 `json:"median"`
	Min      float64 `json:"min"`
	Max      float64 `json:"max"`
	Verified bool    `json:"verified"`
}

// compareWithC runs the C baseline on the same kernel.ptx, resolutions,
// frames, ring and streams, prints its figures beside the Go ones and
// returns them. The C program checks its output frames itself.
func compareWithC(ctx context.Context, cfg config, res Result, w io.Writer) ([]CRow, error) {
	dims := make([]string, len(cfg.res))
	for i, r := range cfg.res {
		dims[i] = fmt.Sprintf("%dx%d", r.Width, r.Height)
	}
	out, err := harness.RunCRef(ctx, cfg.cref, kernelPTX, "--res", strings.Join(dims, ","),
		"--frames", strconv.Itoa(cfg.frames), "--ring", strconv.Itoa(cfg.ring),
		"--streams", strconv.Itoa(cfg.streams), "--reps", strconv.Itoa(cfg.reps))
	if err != nil {
		return nil, err
	}
	crows, err := harness.CRows(out, func(r CRow) (bool, error) {
		if r.Bench != "imagepipeline" || r.Median <= 0 {
			return false, nil
		}
		if r.Kind != "bidir" && !r.Verified {
			return false, fmt.Errorf("the C baseline: %s %dx%d: output not verified", r.Kind, r.Width, r.Height)
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "C baseline (%s, same kernel.ptx, same loops, this run):\n", filepath.Base(cfg.cref))
	for _, r := range cfg.res {
		c := findC(crows, r, "naive", 1)
		g := res.row(r, ModeNaive)
		fmt.Fprintf(w, "  %-6s naive: C %.1f FPS, Go %.1f FPS: Go/C %.2f\n", r.Name, c.Median, g.FPS, g.FPS/c.Median)
		c = findC(crows, r, "pinned", cfg.streams)
		g = res.row(r, ModePinnedN)
		fmt.Fprintf(w, "  %-6s pinned, %d streams: C %.1f FPS, Go %.1f FPS: Go/C %.2f\n", r.Name, cfg.streams, c.Median, g.FPS, g.FPS/c.Median)
		c = findC(crows, r, "bidir", 2)
		fmt.Fprintf(w, "  %-6s both directions at once: C %.1f GB/s\n", r.Name, c.Median)
	}
	return crows, nil
}

// findC returns the C row of a resolution, kind and stream count.
func findC(rows []CRow, r Resolution, kind string, streams int) CRow {
	for _, c := range rows {
		if c.Width == r.Width && c.Height == r.Height && c.Kind == kind && c.Streams == streams {
			return c
		}
	}
	return CRow{}
}
