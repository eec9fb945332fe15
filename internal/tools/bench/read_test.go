package bench

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestCompare(t *testing.T) {
	a := sampleResults()
	b := sampleResults()[1:] // the first result only in a
	b[0].Median = a[1].Median * 2
	b = append(b, Result{Bench: "bw", Kind: "extra", Dir: DirH2D, Size: 1, Unit: GBps, Median: 1, Min: 1, Max: 1})
	cs, onlyA, onlyB := Compare(a, b)
	if onlyA != 1 || onlyB != 1 || len(cs) != len(a)-1 {
		t.Fatalf("Compare: %d pairs, only A %d, only B %d", len(cs), onlyA, onlyB)
	}
	if c := cs[0]; c.Kind != KindPinned || !c.OK || c.Ratio != 2 {
		t.Errorf("first pair %+v, want pinned with ratio 2", c)
	}
	if c := cs[len(cs)-1]; c.OK || c.Ratio != 0 {
		t.Errorf("skipped pair %+v, want no ratio", c)
	}
	// Lower is better for ms: half the time is a ratio of 2.
	ms := []Result{{Bench: "pin", Kind: "k", Dir: OpPin, Size: 1, Unit: Ms, Median: 4, Min: 4, Max: 4}}
	ms2 := []Result{{Bench: "pin", Kind: "k", Dir: OpPin, Size: 1, Unit: Ms, Median: 2, Min: 2, Max: 2}}
	if cs, _, _ := Compare(ms, ms2); len(cs) != 1 || cs[0].Ratio != 2 {
		t.Errorf("ms ratio %+v", cs)
	}
}

func TestReadReportRoundTrip(t *testing.T) {
	var b bytes.Buffer
	m := Meta{Command: "pinmem bench", Partial: true, Config: BandwidthConfig{Samples: 3}}
	if err := WriteJSON(&b, m, sampleResults()); err != nil {
		t.Fatal(err)
	}
	rep, err := ReadReport(&b)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Meta.Schema != SchemaVersion || !rep.Meta.Partial || len(rep.Results) != len(sampleResults()) {
		t.Errorf("read back %+v", rep.Meta)
	}
	if cfg, _ := rep.Meta.Config.(map[string]any); cfg["samples"] != 3.0 {
		t.Errorf("config %v", rep.Meta.Config)
	}
	for _, in := range []string{"", "{", `{"meta":{"schema_version":1},"results":[null]}`, strings.Repeat(" ", 10) + "[]"} {
		if _, err := ReadReport(strings.NewReader(in)); !errors.Is(err, ErrInvalid) {
			t.Errorf("ReadReport(%q) = %v, want ErrInvalid", in, err)
		}
	}
}

// TestVerifyFailedField: a result whose note reports a failed verification
// is written with verify_failed set, and Failed reports it.
func TestVerifyFailedField(t *testing.T) {
	rs := []Result{{Bench: "bw", Kind: KindPinned, Dir: DirH2D, Size: 1, Unit: GBps, Median: 1, Min: 1, Max: 1, Note: verifyFailedMark + ": byte 3 differs"}}
	var b bytes.Buffer
	if err := WriteJSON(&b, Meta{}, rs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"verify_failed": true`) {
		t.Errorf("JSON:\n%s", b.String())
	}
	if !rs[0].Failed() || (Result{Skipped: true, Note: verifyFailedMark}).Failed() {
		t.Error("Failed")
	}
}
