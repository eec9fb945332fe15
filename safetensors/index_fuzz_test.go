package safetensors

import (
	"encoding/json"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"testing"
)

// FuzzParseIndex feeds parseIndex arbitrary bytes: it never panics, a
// refusal matches ErrFormat, and what it accepts is a weight map whose
// shards are all inside the directory and which parses again to itself.
func FuzzParseIndex(f *testing.F) {
	for _, s := range []string{
		`{"metadata": {"total_size": 10}, "weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}`,
		`{"weight_map": {}}`,
		`{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}`,
		`{"weight_map": {"a": "../x.safetensors"}}`,
		`{"weight_map": {"a": "/abs.safetensors"}}`,
		`{"weight_map": {"a": "sub/x.safetensors"}, "weight_map": {}}`,
		`{"weight_map": {"a": 1}}`,
		`{"weight_map": {"a": "x"}} trailing`,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		weights, shards, err := parseIndex(b)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("refusal %v does not match ErrFormat", err)
			}
			return
		}
		if weights == nil {
			t.Fatal("accepted without a weight map")
		}
		var want []string
		for name, s := range weights {
			if !filepath.IsLocal(filepath.FromSlash(s)) {
				t.Fatalf("tensor %q placed in %q, outside the directory", name, s)
			}
			want = append(want, s)
		}
		slices.Sort(want)
		if want = slices.Compact(want); !slices.Equal(want, shards) {
			t.Fatalf("shards %q, want %q", shards, want)
		}
		again, err := json.Marshal(map[string]any{"weight_map": weights})
		if err != nil {
			t.Fatal(err)
		}
		w2, _, err := parseIndex(again)
		if err != nil || !maps.Equal(weights, w2) {
			t.Fatalf("the accepted map does not parse again to itself: %v", err)
		}
	})
}

// TestParseIndex checks what parseIndex accepts and refuses.
func TestParseIndex(t *testing.T) {
	w, shards, err := parseIndex([]byte(`{"metadata": {"x": [1, {"y": 2}]}, "weight_map": {"a": "s1", "b": "s2", "c": "s1"}}`))
	if err != nil || len(w) != 3 || !slices.Equal(shards, []string{"s1", "s2"}) {
		t.Errorf("parseIndex = %v, %v, %v", w, shards, err)
	}
	for _, bad := range []string{
		`{"weight_map": {"a": "s1", "a": "s2"}}`,
		`{"weight_map": {"a": "../s"}}`,
		`{"weight_map": {"a": "/s"}}`,
		`{"weight_map": {"a": ""}}`,
		`{"weight_map": {"a": "x\\..\\..\\s"}}`,
		`{"weight_map": {}, "weight_map": {}}`,
		`{"metadata": {}}`,
		`{"weight_map": {"a": "s"}} {}`,
		`{"weight_map": ["s"]}`,
		"{\"weight_map\": {\"\xff\": \"s\"}}",
	} {
		if _, _, err := parseIndex([]byte(bad)); !errors.Is(err, ErrFormat) {
			t.Errorf("parseIndex(%s) = %v, want ErrFormat", bad, err)
		}
	}
}
