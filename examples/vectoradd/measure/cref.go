package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
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
	dir, err := os.MkdirTemp("", "vectoradd-ptx")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ptx := filepath.Join(dir, "kernel.ptx")
	if err := os.WriteFile(ptx, kernelPTX, 0o644); err != nil {
		return nil, err
	}
	sizes := make([]string, len(cfg.sizes))
	for i, s := range cfg.sizes {
		sizes[i] = strconv.Itoa(s)
	}
	cmd := exec.CommandContext(ctx, cfg.cref, ptx, "--sizes", strings.Join(sizes, ","), "--reps", strconv.Itoa(cfg.reps))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("the C baseline %s: %w: %s", cfg.cref, err, strings.TrimSpace(stderr.String()))
	}
	var crows []CRow
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r CRow
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.Bench != "vectoradd" || r.Median <= 0 {
			continue // the info line, or not a result
		}
		if !r.Verified {
			return nil, fmt.Errorf("the C baseline: %s %d bytes: result not verified", r.Kind, r.Size)
		}
		crows = append(crows, r)
	}
	if len(crows) == 0 {
		return nil, errors.New("the C baseline printed no result line")
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
