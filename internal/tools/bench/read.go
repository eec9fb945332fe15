package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strings"
)

// MaxReportBytes bounds what ReadReport reads: a full run is well under a
// megabyte.
const MaxReportBytes = 64 << 20

// ReadReport decodes a report written by WriteJSON and checks it: one JSON
// object with "meta" (a schema_version from 1 to SchemaVersion) and
// "results", nothing after it, every result with a bench, kind, direction
// and known unit, sizes and samples not negative and figures that are
// finite and ordered (min <= median <= max). Errors match ErrInvalid and
// say what is wrong in one line.
func ReadReport(r io.Reader) (Report, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxReportBytes+1))
	if err != nil {
		return Report{}, err
	}
	if len(data) > MaxReportBytes {
		return Report{}, invalid("report larger than %s", FormatSize(MaxReportBytes))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var rep struct {
		Meta    *Meta     `json:"meta"`
		Results []*Result `json:"results"`
	}
	if err := dec.Decode(&rep); err != nil {
		return Report{}, invalid("not a pinmem report: %s", oneLine(jsonError(data, err)))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Report{}, invalid("not a pinmem report: data after the JSON object")
	}
	switch {
	case rep.Meta == nil:
		return Report{}, invalid("not a pinmem report: no \"meta\" object")
	case rep.Results == nil:
		return Report{}, invalid("not a pinmem report: no \"results\" list")
	case rep.Meta.Schema < 1:
		return Report{}, invalid("not a pinmem report: meta.schema_version missing or below 1")
	case rep.Meta.Schema > SchemaVersion:
		return Report{}, invalid("report schema version %d is newer than this pinmem reads (%d): use a newer pinmem", rep.Meta.Schema, SchemaVersion)
	}
	out := Report{Meta: *rep.Meta, Results: make([]Result, 0, len(rep.Results))}
	for i, r := range rep.Results {
		if r == nil {
			return Report{}, invalid("result %d: null", i)
		}
		if err := r.check(); err != nil {
			return Report{}, invalid("result %d (%s %s %s): %s", i, r.Bench, r.Kind, r.Dir, err)
		}
		renameStaged(r)
		out.Results = append(out.Results, *r)
	}
	return out, nil
}

// stagedNote is added to a row read as KindStaged.
const stagedNote = "recorded as kind staged (copier's old name): every size staged through the pinned ring"

// renameStaged reads a bandwidth row of the deprecated kind KindStaged as
// KindCopier, saying so in its note.
func renameStaged(r *Result) {
	if r.Bench == "bw" && r.Kind == KindStaged {
		r.Kind = KindCopier
		r.Note = joinNotes([]string{stagedNote, r.Note})
	}
}

// check validates a decoded result.
func (r *Result) check() error {
	switch {
	case r.Bench == "" || r.Kind == "" || r.Dir == "":
		return errors.New("bench, kind and dir must not be empty")
	case r.Unit != GBps && r.Unit != Ms && r.Unit != FPS && r.Unit != CPUsPerGB:
		return fmt.Errorf("unknown unit %q (want %s, %s, %s or %s)", r.Unit, GBps, Ms, FPS, CPUsPerGB)
	case r.Size < 0 || r.Samples < 0:
		return errors.New("negative size or samples")
	}
	for _, v := range []float64{r.Median, r.Min, r.Max} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("figure %v is not a finite value of at least 0", v)
		}
	}
	if !r.Skipped && (r.Min > r.Median || r.Median > r.Max) {
		return fmt.Errorf("min %v, median %v, max %v are not in order", r.Min, r.Median, r.Max)
	}
	return nil
}

// jsonError adds the line and column to a decoding error.
func jsonError(data []byte, err error) string {
	var off int64 = -1
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		off = te.Offset
	}
	if errors.Is(err, io.EOF) {
		return "empty input"
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "truncated JSON"
	}
	if off < 0 || off > int64(len(data)) {
		return err.Error()
	}
	line := 1 + bytes.Count(data[:off], []byte("\n"))
	col := off - int64(bytes.LastIndexByte(data[:off], '\n')+1) // the offset is just past the bad byte
	col = max(col, 1)
	msg := err.Error()
	if te != nil {
		// Say it in JSON's terms, not Go's types.
		msg = fmt.Sprintf("a JSON %s where \"%s\" wants %s", te.Value, te.Field, jsonKind(te.Type))
		if te.Field == "" {
			msg = fmt.Sprintf("the top level is a JSON %s; a report is an object with \"meta\" and \"results\"", te.Value)
		}
	}
	return fmt.Sprintf("line %d, column %d: %s", line, col, msg)
}

// jsonKind names what JSON a Go type takes.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "another value"
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Comparison is one result present in both of two reports: Ratio is how
// much better B is than A (see Ratio: above 1 is better, for any unit).
type Comparison struct {
	Bench, Kind, Dir string
	Size             int64
	Unit             Unit
	A, B             float64 // the medians
	Ratio            float64 // 0 when either side has no value
	OK               bool    // both sides have a value
	// Noise is set when the two rows' sample ranges (min to max) overlap:
	// a difference of medians within the spread of the samples, which
	// compare does not call a regression.
	Noise bool
}

// SameSetup returns why two reports' figures should not be compared as
// one machine's before and after: different devices or drivers ("" when
// they match).
func SameSetup(a, b Meta) string {
	var why []string
	if a.Device != b.Device {
		why = append(why, fmt.Sprintf("devices differ (%s / %s)", a.Device, b.Device))
	}
	if a.Driver != b.Driver {
		why = append(why, fmt.Sprintf("drivers differ (%s / %s)", a.Driver, b.Driver))
	}
	return strings.Join(why, "; ")
}

// Compare pairs the results of a and b with the same bench, kind,
// direction, size and unit, in a's order. Results in only one report are
// left out; onlyA and onlyB count them.
func Compare(a, b []Result) (cs []Comparison, onlyA, onlyB int) {
	type key struct {
		bench, kind, dir string
		size             int64
		unit             Unit
	}
	kb := map[key]Result{}
	for _, r := range b {
		kb[key{r.Bench, r.Kind, r.Dir, r.Size, r.Unit}] = r
	}
	used := map[key]bool{}
	for _, r := range a {
		k := key{r.Bench, r.Kind, r.Dir, r.Size, r.Unit}
		o, ok := kb[k]
		if !ok || used[k] {
			onlyA++
			continue
		}
		used[k] = true
		c := Comparison{Bench: r.Bench, Kind: r.Kind, Dir: r.Dir, Size: r.Size, Unit: r.Unit, A: r.Median, B: o.Median}
		c.Ratio, c.OK = Ratio(o, r)
		c.Noise = c.OK && o.Min <= r.Max && r.Min <= o.Max
		cs = append(cs, c)
	}
	return cs, onlyA, len(b) - len(used)
}
