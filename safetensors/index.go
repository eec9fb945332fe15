package safetensors

import (
	"encoding/json"
	"errors"
	"io"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"
)

// indexName is the file name of a sharded checkpoint's index, as Hugging
// Face publishes it: a JSON object whose "weight_map" maps each tensor
// name to the shard file that holds it.
const indexName = "model.safetensors.index.json"

// maxIndexSize bounds the index file parseIndex reads: 64 MiB, far above
// any published index (a few MB for models of thousands of tensors).
const maxIndexSize = 64 << 20

// parseIndex parses a sharded checkpoint's index: a JSON object with a
// "weight_map" object of tensor names to shard file names, and any other
// top-level keys (such as "metadata"), which are skipped. It is strict
// where a loader must be: a key given twice (a tensor named twice would
// otherwise keep only its last shard silently), a shard name that is not
// a relative path inside the index's directory (absolute, with "..", or
// empty), a name that is not valid UTF-8 or trailing data are each a
// *FormatError. It returns the weight map and the shard names, sorted and
// without repeats.
func parseIndex(b []byte) (map[string]string, []string, error) {
	if len(b) > maxIndexSize {
		return nil, nil, formatErr(-1, "index of %d bytes exceeds the limit of %d", len(b), maxIndexSize)
	}
	if !utf8.Valid(b) {
		return nil, nil, formatErr(-1, "index is not valid UTF-8")
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	tok := func(what string) (json.Token, error) {
		t, err := dec.Token()
		if err != nil {
			return nil, formatErr(dec.InputOffset(), "index: %s: %v", what, err)
		}
		return t, nil
	}
	if t, err := tok("the top-level object"); err != nil {
		return nil, nil, err
	} else if d, ok := t.(json.Delim); !ok || d != '{' {
		return nil, nil, formatErr(0, "index is %s, not an object", describe(t))
	}
	var weights map[string]string
	seen := map[string]bool{}
	for dec.More() {
		t, err := tok("a key")
		if err != nil {
			return nil, nil, err
		}
		key, _ := t.(string)
		if seen[key] {
			return nil, nil, formatErr(dec.InputOffset(), "index: key %s given twice", quote(key))
		}
		seen[key] = true
		if key != "weight_map" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, nil, formatErr(dec.InputOffset(), "index: value of %s: %v", quote(key), err)
			}
			continue
		}
		if weights, err = parseWeightMap(dec, tok); err != nil {
			return nil, nil, err
		}
	}
	if _, err := tok("the end of the object"); err != nil {
		return nil, nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, nil, formatErr(dec.InputOffset(), "index: data after the object")
	}
	if weights == nil {
		return nil, nil, formatErr(-1, `index has no "weight_map"`)
	}
	var shards []string
	for _, s := range weights {
		shards = append(shards, s)
	}
	slices.Sort(shards)
	return weights, slices.Compact(shards), nil
}

// parseWeightMap parses the weight map's object of names to shard names.
func parseWeightMap(dec *json.Decoder, tok func(string) (json.Token, error)) (map[string]string, error) {
	if t, err := tok("weight_map"); err != nil {
		return nil, err
	} else if d, ok := t.(json.Delim); !ok || d != '{' {
		return nil, formatErr(dec.InputOffset(), "index: weight_map is %s, not an object", describe(t))
	}
	weights := map[string]string{}
	for dec.More() {
		t, err := tok("a tensor name")
		if err != nil {
			return nil, err
		}
		name, _ := t.(string)
		if _, dup := weights[name]; dup {
			return nil, formatErr(dec.InputOffset(), "index names tensor %s twice", quote(name))
		}
		if t, err = tok("a shard name"); err != nil {
			return nil, err
		}
		shard, ok := t.(string)
		if !ok {
			return nil, formatErr(dec.InputOffset(), "index: shard of tensor %s is %s, not a string", quote(name), describe(t))
		}
		if !filepath.IsLocal(filepath.FromSlash(shard)) || strings.ContainsRune(shard, '\\') {
			return nil, formatErr(dec.InputOffset(), "index: shard %s of tensor %s is not a file inside the index's directory", quote(shard), quote(name))
		}
		weights[name] = path.Clean(shard) // "./a" and "a" are one shard
	}
	_, err := tok("the end of weight_map")
	return weights, err
}
