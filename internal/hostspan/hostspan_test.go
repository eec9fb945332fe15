package hostspan

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestEachPiece: the parts of a range between registration cuts.
func TestEachPiece(t *testing.T) {
	for _, tc := range []struct {
		cuts   []int
		lo, hi int
		want   [][2]int
	}{
		{nil, 0, 10, [][2]int{{0, 10}}},
		{[]int{5}, 0, 10, [][2]int{{0, 5}, {5, 10}}},
		{[]int{5}, 5, 10, [][2]int{{5, 10}}},
		{[]int{5}, 0, 5, [][2]int{{0, 5}}},
		{[]int{2, 4, 8}, 3, 9, [][2]int{{3, 4}, {4, 8}, {8, 9}}},
		{[]int{2, 4, 8}, 9, 12, [][2]int{{9, 12}}},
	} {
		var got [][2]int
		if err := EachPiece(tc.cuts, tc.lo, tc.hi, func(a, b int) error { got = append(got, [2]int{a, b}); return nil }); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("cuts %v, [%d, %d): %v, want %v", tc.cuts, tc.lo, tc.hi, got, tc.want)
		}
	}
}

// TestNormalizeSplitCovers: overlapping and touching spans merge, cuts
// split them only inside, and Covers sees gaps.
func TestNormalizeSplitCovers(t *testing.T) {
	got := Normalize([]Span{{8, 12}, {0, 4}, {4, 6}, {10, 14}, {20, 21}})
	if want := []Span{{0, 6}, {8, 14}, {20, 21}}; !slices.Equal(got, want) {
		t.Fatalf("Normalize: %v, want %v", got, want)
	}
	split := SplitAt(got, []int{10, 3, 3, 6, 30})
	if want := []Span{{0, 3}, {3, 6}, {8, 10}, {10, 14}, {20, 21}}; !slices.Equal(split, want) {
		t.Fatalf("SplitAt: %v, want %v", split, want)
	}
	if Covers(split, 21) || !Covers([]Span{{0, 3}, {3, 9}}, 9) || Covers([]Span{{0, 3}, {3, 9}}, 10) || !Covers(nil, 0) {
		t.Fatal("Covers is wrong about a gap or the end")
	}
}

// TestWithin: the parts of a window inside sorted spans, as offsets from
// the window, and the first error ends the walk.
func TestWithin(t *testing.T) {
	s := []Span{{0, 4}, {6, 10}, {12, 20}}
	var got [][2]int
	if err := Within(s, 3, 12, func(lo, hi int) error { got = append(got, [2]int{lo, hi}); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := [][2]int{{0, 1}, {3, 7}, {9, 12}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Within: %v, want %v", got, want)
	}
	boom := errors.New("boom")
	calls := 0
	if err := Within(s, 0, 20, func(int, int) error { calls++; return boom }); !errors.Is(err, boom) || calls != 1 {
		t.Fatalf("Within after an error: %v, %d calls", err, calls)
	}
}

// TestParts: the pinned parts and the gaps of a window, in order, as
// offsets from its start.
func TestParts(t *testing.T) {
	type part struct {
		lo, hi int
		pinned bool
	}
	for _, c := range []struct {
		s      []Span
		off, n int
		want   []part
	}{
		{nil, 0, 10, []part{{0, 10, false}}},
		{[]Span{{0, 10}}, 0, 10, []part{{0, 10, true}}},
		{[]Span{{2, 4}, {4, 6}, {8, 12}}, 1, 10, []part{{0, 1, false}, {1, 3, true}, {3, 5, true}, {5, 7, false}, {7, 10, true}}},
		{[]Span{{2, 4}}, 4, 4, []part{{0, 4, false}}},
	} {
		var got []part
		_ = Parts(c.s, c.off, c.n, func(lo, hi int, pinned bool) error {
			got = append(got, part{lo, hi, pinned})
			return nil
		})
		if !slices.Equal(got, c.want) {
			t.Errorf("Parts(%v, %d, %d) = %v, want %v", c.s, c.off, c.n, got, c.want)
		}
	}
}
