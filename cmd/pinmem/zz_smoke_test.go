package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

func TestZZSmoke(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	for _, args := range [][]string{
		{"bench", "--sizes", "64KiB", "--samples", "1", "--format", "csv"},
		{"bench", "pin", "--sizes", "1MiB", "--samples", "1"},
		{"bench", "overlap", "--chunks", "2", "--chunk-size", "64KiB", "--vecadd-size", "64KiB", "--samples", "1"},
		{"zerocopy", "--sizes", "64KiB", "--samples", "1"},
		{"bench", "matrix", "--sizes", "64KiB", "--samples", "1"},
		{"doctor"},
	} {
		var out, errb bytes.Buffer
		code := execute(context.Background(), args, &out, &errb)
		t.Logf("%v: %d\n%s\nSTDERR:%s", args, code, out.String(), errb.String())
	}
}
