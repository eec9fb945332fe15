package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pinmem/pinmem/examples/internal/harness"
)

// CRow is one result line of the C baseline (cref/vectoradd.c): the same
// loop as a Row, timed the same way, in milliseconds.
type CRow struct {
	Bench      string  `json:"bench"`
	Kind       string  `json:"kind"` // "pageable" or "pinned"
	Size       int     `json:"size"`
	Median     float64 `json:"median"` // the whole iteration
	CopyInMS   float64 `json:"copy_in_ms"`
	KernelMS   float64 `json:"kernel_ms"`
	CopyOutMS  float64 `json:"copy_out_ms"`
	TransferMS float64 `json:"transfer_ms"`
	Verified   bool    `json:"verified"`
}

// compareWithC runs the C baseline on the same kernel.ptx and sizes, prints
// its rows beside the Go ones and returns them. The C program checks c
// itself and exits non-zero when an element is wrong.
func compareWithC(ctx context.Context, cfg config, rows []Row, w io.Writer) ([]CRow, error) {
	sizes := make([]string, len(cfg.sizes))
	for i, s := range cfg.sizes {
		sizes[i] = strconv.Itoa(s)
	}
	out, err := harness.RunCRef(ctx, cfg.cref, kernelPTX, "--sizes", strings.Join(sizes, ","), "--reps", strconv.Itoa(cfg.reps))
	if err != nil {
		return nil, err
	}
	crows, err := harness.CRows(out, func(r CRow) (bool, error) {
		if r.Bench != "vectoradd" || r.Median <= 0 {
			return false, nil // not a result
		}
		if !r.Verified {
			return false, fmt.Errorf("the C baseline: %s %d bytes: result not verified", r.Kind, r.Size)
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "C baseline (%s, same kernel.ptx, same loop, this run):\n", filepath.Base(cfg.cref))
	for _, c := range crows {
		g := find(rows, c.Size, c.Kind)
		cd := time.Duration(c.TransferMS * 1e6)
		fmt.Fprintf(w, "  %-9s %-9s C transfer %s, Go %s: Go/C %.2f\n",
			mib(c.Size), c.Kind, ms(cd), ms(g.Transfer()), ratio(g.Transfer(), cd))
	}
	return crows, nil
}
