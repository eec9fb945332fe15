package bench

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseCRef: the C reference's JSON lines become rows of kind c:KIND;
// lines of another unit, without samples or out of order are left out.
func TestParseCRef(t *testing.T) {
	out := bytes.NewBufferString(`{"bench":"bw","kind":"pinned","size":16777216,"dir":"h2d","unit":"gbps","samples":5,"median":54.9,"min":54.8,"max":55.0,"reps":66,"verified":true}
{"bench":"bw","kind":"pinned","size":1048576,"dir":"none","unit":"ms","samples":3,"median":1,"min":1,"max":1}
not json
{"bench":"blocks","kind":"loop","size":16384,"dir":"h2d","unit":"gbps","samples":11,"median":9.1,"min":8.8,"max":9.4,"blocks":4096,"issue_ns_per_block":1500,"verified":true}
{"bench":"bw","kind":"pageable","size":1,"dir":"h2d","unit":"gbps","samples":5,"median":5,"min":6,"max":7}
`)
	rs := ParseCRef(out, "cref/bw")
	if len(rs) != 2 {
		t.Fatalf("%d rows: %+v", len(rs), rs)
	}
	if r := rs[0]; r.Kind != "c:pinned" || r.Bench != "bw" || r.Unit != GBps || r.Median != 54.9 || !r.Verified || r.Timing != TimingEvents {
		t.Errorf("bw row %+v", r)
	}
	if r := rs[1]; r.Kind != "c:loop" || r.Bench != "blocks" || r.Timing != TimingWall {
		t.Errorf("blocks row %+v", r)
	}
}

// TestCRefRowsMissingProgram: a C reference that cannot run gives one
// skipped row saying why, not an error of the run.
func TestCRefRowsMissingProgram(t *testing.T) {
	rs := CRefRows(context.Background(), filepath.Join(t.TempDir(), "bw"), nil)
	if len(rs) != 1 || !rs[0].Skipped || !strings.Contains(rs[0].Note, "C reference") {
		t.Errorf("%+v", rs)
	}
}

// TestParseTorchLoad: the warm runs of scripts/torch-load.py's output
// become one row the size of the file; output without warm runs is an error.
func TestParseTorchLoad(t *testing.T) {
	r, err := ParseTorchLoad([]byte(`{"tool":"safetensors.torch.load_file","bytes":1000,"runs":[{"seconds":1,"gbps":4.5,"cold":false},{"seconds":1,"gbps":4.7,"cold":false},{"seconds":2,"gbps":1.0,"cold":true}],"median_gbps":4.6}`), 1024)
	if err != nil || r.Kind != KindTorch || r.Size != 1024 || r.Samples != 2 || r.Median != 4.6 || r.Min != 4.5 || r.Max != 4.7 {
		t.Errorf("%+v, %v", r, err)
	}
	for _, bad := range []string{"", "{", `{"runs":[{"gbps":1,"cold":true}]}`} {
		if _, err := ParseTorchLoad([]byte(bad), 1); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestParseTorchLoadCheckpoint: for a checkpoint (no file size) the row's
// size is the tensor bytes the script reports, as the loader's checkpoint
// row's, so that the two pair up.
func TestParseTorchLoadCheckpoint(t *testing.T) {
	r, err := ParseTorchLoad([]byte(`{"bytes":4294967296,"runs":[{"seconds":0.7,"gbps":6.1,"cold":false}]}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Size != 4294967296 {
		t.Errorf("size %d, want the tensor bytes 4294967296", r.Size)
	}
}

// TestSelectParts: -t picks tests by name in run order; an unknown name
// is an error naming the known ones.
func TestSelectParts(t *testing.T) {
	all := SuiteParts()
	ps, err := SelectParts(all, "pin, bw")
	if err != nil || len(ps) != 2 || ps[0].Name != "bw" || ps[1].Name != "pin" {
		t.Errorf("%v, %v", ps, err)
	}
	if _, err := SelectParts(all, "bw,nope"); err == nil || !strings.Contains(err.Error(), "copier") {
		t.Errorf("unknown test: %v", err)
	}
	if ps, _ := SelectParts(all, "all"); len(ps) != len(all) {
		t.Errorf("all: %d parts", len(ps))
	}
}

// TestParseResultLines: result rows one a line are read with blank lines
// skipped; a line that is not a row, or a row with figures out of order,
// is an ErrInvalid error naming the line, with the rows before it.
func TestParseResultLines(t *testing.T) {
	good := `{"bench":"imagepipeline","kind":"naive","dir":"4K","size":33177600,"unit":"FPS","median":10,"min":9,"max":11,"samples":3,"verified":true,"timing":"wall","skipped":false,"verify_failed":false}`
	rs, err := ParseResultLines([]byte(good + "\n\n" + good + "\n"))
	if err != nil || len(rs) != 2 || rs[1].Median != 10 || rs[1].Dir != "4K" {
		t.Fatalf("ParseResultLines = %+v, %v", rs, err)
	}
	for _, bad := range []struct{ line, want string }{
		{`imagepipeline: 4K: 10 FPS`, "line 2: not a result row"},
		{`{"bench":"imagepipeline","kind":"naive","dir":"4K","unit":"FPS","fps":3}`, "line 2: not a result row"},
		{`{"bench":"imagepipeline","kind":"naive","dir":"4K","unit":"FPS","median":10,"min":12,"max":11}`, "line 2 (imagepipeline naive 4K): min 12"},
	} {
		rs, err := ParseResultLines([]byte(good + "\n" + bad.line + "\n"))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), bad.want) || len(rs) != 1 {
			t.Errorf("ParseResultLines(%s) = %d rows, %v; want ErrInvalid %q and the row before it", bad.line, len(rs), err, bad.want)
		}
	}
}
