package main

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
)

// resultRow is one result of pinmem's result files
// (docs/results/result.schema.json, an item of "results"). With -json the
// program prints one per line, and `pinmem bench all --imagepipeline BIN`
// puts them in its run's report beside its other tests.
type resultRow struct {
	Bench        string  `json:"bench"`
	Kind         string  `json:"kind"`
	Dir          string  `json:"dir"`  // the resolution
	Size         int64   `json:"size"` // bytes of one frame
	Unit         string  `json:"unit"`
	Median       float64 `json:"median"`
	Min          float64 `json:"min"`
	Max          float64 `json:"max"`
	Samples      int     `json:"samples"`
	Verified     bool    `json:"verified"`
	Timing       string  `json:"timing"`
	Skipped      bool    `json:"skipped"`
	VerifyFailed bool    `json:"verify_failed"`
	Note         string  `json:"note,omitempty"`
}

// Kinds of the rows -json prints. pinmem compares each with its reference
// in the same run: naive and pinned on N streams with the C baseline's
// same loops, one stream with the copy bound, the Pipeline with the staged
// bound. The bounds are computed from measured copy rates.
const (
	KindBound       = "bound"        // a frame in and out at the rate of pinned copies both ways at once
	KindStagedBound = "staged-bound" // a frame in and out at the rate of Go memory staged both ways at once
	KindCPrefix     = "c:"           // the C baseline's rows
)

// kindOf returns the result kind of a mode on streams streams.
func kindOf(mode string, streams int) string {
	switch mode {
	case ModePinned1:
		return "pinned-1stream"
	case ModePinnedN:
		return fmt.Sprintf("pinned-%dstreams", streams)
	}
	return mode // naive, pipeline
}

// resolutionRows returns the rows of one resolution: every mode and the
// two bounds.
func resolutionRows(cfg config, rows []Row, b Bound) []resultRow {
	size := int64(b.Res.Bytes())
	var out []resultRow
	for _, x := range rows {
		if x.Mode == ModePinnedN && cfg.streams == 1 {
			continue // the same loop as pinned-1stream
		}
		r := resultRow{Bench: "imagepipeline", Kind: kindOf(x.Mode, cfg.streams), Dir: b.Res.Name, Size: size, Unit: "FPS",
			Median: x.FPS, Min: x.Min, Max: x.Max, Samples: x.Samples, Verified: true, Timing: "wall",
			Note: modeName(x.Mode, cfg.streams)}
		if x.Mode == ModePipeline && x.StagedShare > 0 {
			r.Note += fmt.Sprintf("; %.1f%% of the staged bound measured beside each run", 100*x.StagedShare)
		}
		out = append(out, r)
	}
	for _, c := range []struct {
		kind      string
		fps, gbps float64
		what      string
	}{
		{KindBound, b.FPS, b.BidirGBps, "pinned copies both ways at once"},
		{KindStagedBound, b.StagedFPS, b.StagedGBps, "Go memory staged both ways at once by two transfer.Copiers"},
	} {
		out = append(out, resultRow{Bench: "imagepipeline", Kind: c.kind, Dir: b.Res.Name, Size: size, Unit: "FPS",
			Median: c.fps, Min: c.fps, Max: c.fps, Timing: "computed",
			Note: fmt.Sprintf("computed: a frame in and out at the measured rate of %s, %.1f GB/s", c.what, c.gbps)})
	}
	return out
}

// cRows returns the C baseline's frame rates as rows (its copy rate, in
// GB/s, is left to the text).
func cRows(cfg config, crows []CRow) []resultRow {
	var out []resultRow
	for _, r := range cfg.res {
		for _, c := range []CRow{findC(crows, r, "naive", 1), findC(crows, r, "pinned", cfg.streams)} {
			if c.Median <= 0 {
				continue
			}
			mode := ModeNaive
			if c.Kind == "pinned" {
				mode = ModePinnedN
				if cfg.streams == 1 {
					mode = ModePinned1
				}
			}
			lo, hi, n := c.Min, c.Max, c.Samples
			if lo <= 0 || hi < c.Median || lo > c.Median {
				lo, hi = c.Median, c.Median // a baseline that reports its median only
			}
			out = append(out, resultRow{Bench: "imagepipeline", Kind: KindCPrefix + kindOf(mode, cfg.streams), Dir: r.Name, Size: int64(r.Bytes()), Unit: "FPS",
				Median: c.Median, Min: lo, Max: hi, Samples: max(n, 1), Verified: c.Verified, Timing: "wall",
				Note: fmt.Sprintf("C baseline (%s, driver API, the same kernel.ptx and loop)", filepath.Base(cfg.cref))})
		}
	}
	return out
}

// writeRows prints rows as JSON lines.
func writeRows(w io.Writer, rows []resultRow) error {
	enc := json.NewEncoder(w)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
