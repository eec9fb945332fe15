package safetensors

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pinmem/pinmem/internal/regfile"
	"github.com/pinmem/pinmem/load"
)

// shard is one open file of a checkpoint, or the file of Load.
type shard struct {
	name string      // as the index names it, or the file's name
	f    *os.File    // open while the load reads it through lp
	fi   os.FileInfo // f's, when it was opened, before its header was parsed
	lp   string      // the path the load opens: the very file f is open on
	h    *Header
}

// unchanged returns an error matching load.ErrChanged when the shard's
// size or modification time differs from when it was opened. The load
// checks its files from its own open of lp to its end; this covers the
// time before, from the header's parse on, in which part or dst ran and
// the load may have waited for its turn: data read after a change would
// be placed by another version's header.
func (s *shard) unchanged() error {
	fi, err := s.f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() != s.fi.Size() || !fi.ModTime().Equal(s.fi.ModTime()) {
		return fmt.Errorf("%s changed since its header was read: size %d -> %d, modified %v -> %v: %w",
			quote(s.name), s.fi.Size(), fi.Size(), s.fi.ModTime(), fi.ModTime(), load.ErrChanged)
	}
	return nil
}

// Whole returns the part function of LoadCheckpoint that loads all of
// each tensor for which dst returns a buffer, and leaves out the others.
func Whole(dst Destination) func(Tensor) (load.Range, error) {
	return func(t Tensor) (load.Range, error) {
		b, err := dst(t)
		if err != nil || b == nil {
			return load.Range{}, err
		}
		return load.Range{Length: t.Size(), Dst: b}, nil
	}
}

// LoadCheckpoint loads the tensors of a checkpoint as published: path is
// a sharded checkpoint's index (model.safetensors.index.json, whose
// weight_map names each tensor's shard in the index's directory), a
// directory holding such an index, or else a directory of .safetensors
// files or one .safetensors file. Every shard's header is parsed and
// checked, and part is called for every tensor, in shard order and then
// in the order of each Header's Tensors, before anything is read.
//
// part chooses what of tensor t to load and where: a load.Range whose
// Offset is relative to t's first byte (0 for all of it; a rank's slice
// of rows is the byte range of those rows), whose Length is at most
// t.Size() - Offset, and whose Dst holds at least Length bytes. A Range of
// length 0 leaves the tensor out. Whole(dst) loads whole tensors into the
// buffers of a Destination.
//
// The shards are loaded by l's readers in parallel (see
// load.Loader.LoadFiles), under its one pinned budget: reading waits for
// copying. The readers take the tensors in shard order and file order, so
// that they land in about that order, the first one soonest. ready, when
// not nil, is called with each loaded tensor as soon as its bytes are on
// the device, in the order tensors land, so that a server can start before
// the last byte; it runs on a loader goroutine (see LoadFiles for its
// rules and for panics).
//
// Errors, all before anything is read unless said otherwise: a malformed
// index (a tensor named twice, a shard outside the index's directory) or
// shard, a tensor found in a shard that the index does not place there,
// a tensor in two shards, or a tensor of the index that no shard holds
// match ErrFormat; a missing shard matches fs.ErrNotExist; a part out of
// its tensor's bounds matches ErrInvalid; a bad destination is a
// *load.RangeError; a shard that changes from its header's parse to the
// end of the load matches load.ErrChanged (found at the end of the load),
// and one that shrinks while it is read load.ErrShortFile. After an
// error nothing stays pinned but the stages l pinned, which it keeps for
// its next load until Close; free the destinations once l.Wait has
// returned nil (a load whose ctx ended may have left copies into them
// queued).
func LoadCheckpoint(ctx context.Context, l *load.Loader, path string, part func(Tensor) (load.Range, error), ready func(Tensor)) (load.Stats, error) {
	st := load.Stats{Resident: -1}
	if l == nil || part == nil {
		return st, fmt.Errorf("%w: nil Loader or part function", ErrInvalid)
	}
	shards, weights, err := openCheckpoint(path)
	defer func() {
		for _, s := range shards {
			s.f.Close()
		}
	}()
	if err != nil {
		return st, err
	}
	files, tensors, err := planShards(shards, weights, part)
	if err != nil {
		return st, err
	}
	var landed func(int, int)
	if ready != nil {
		landed = func(f, r int) { ready(tensors[f][r]) }
	}
	st, err = l.LoadFiles(ctx, files, landed)
	for _, s := range shards {
		if err != nil {
			break
		}
		err = s.unchanged()
	}
	if err != nil {
		nameShortShard(err, shards)
		return st, fmt.Errorf("safetensors: loading %s: %w", path, err)
	}
	return st, nil
}

// planShards checks the tensors of the shards against each other and the
// index's weight map (nil without an index), and asks part for each
// tensor's range. It returns one load.File per shard, with the ranges to
// load as offsets in the file, and for each the tensors those ranges hold.
func planShards(shards []*shard, weights map[string]string, part func(Tensor) (load.Range, error)) ([]load.File, [][]Tensor, error) {
	files := make([]load.File, len(shards))
	tensors := make([][]Tensor, len(shards)) // the loaded tensors, as their ranges in files
	where := map[string]string{}             // tensor name -> shard it was found in
	for i, s := range shards {
		files[i].Path = s.lp
		for _, t := range s.h.Tensors {
			if prev, dup := where[t.Name]; dup {
				return nil, nil, formatErr(-1, "tensor %s is in shards %s and %s", quote(t.Name), quote(prev), quote(s.name))
			}
			where[t.Name] = s.name
			if weights != nil && weights[t.Name] != s.name {
				return nil, nil, formatErr(-1, "shard %s holds tensor %s, which the index places in %s", quote(s.name), quote(t.Name), quote(weights[t.Name]))
			}
			rg, err := tensorPart(t, part)
			if err != nil {
				return nil, nil, err
			}
			if rg.Length == 0 {
				continue
			}
			files[i].Ranges = append(files[i].Ranges, rg)
			tensors[i] = append(tensors[i], t)
		}
	}
	for name, sh := range weights {
		if _, ok := where[name]; !ok {
			return nil, nil, formatErr(-1, "the index places tensor %s in shard %s, which does not hold it", quote(name), quote(sh))
		}
	}
	return files, tensors, nil
}

// tensorPart returns the range part chooses of tensor t, checked against
// t's bounds and moved from t's first byte to the file's; a range of
// length 0 (the tensor left out) is returned as part gave it.
func tensorPart(t Tensor, part func(Tensor) (load.Range, error)) (load.Range, error) {
	rg, err := part(t)
	if err != nil {
		return rg, fmt.Errorf("safetensors: part of tensor %s: %w", quote(t.Name), err)
	}
	if rg.Length == 0 {
		return rg, nil
	}
	if rg.Offset < 0 || rg.Length < 0 || rg.Offset > t.Size() || rg.Length > t.Size()-rg.Offset {
		return rg, fmt.Errorf("%w: part [%d, +%d) of tensor %s of %d bytes", ErrInvalid, rg.Offset, rg.Length, quote(t.Name), t.Size())
	}
	rg.Offset += t.Begin
	return rg, nil
}

// nameShortShard names the shard in err's *load.ShortFileError, if any, as
// the checkpoint names it rather than by the path the load opened.
func nameShortShard(err error, shards []*shard) {
	for _, s := range shards {
		if se, ok := errors.AsType[*load.ShortFileError](err); ok && se.Path == s.lp {
			se.Path = s.name
		}
	}
}

// openCheckpoint opens and parses the shards of the checkpoint at path
// (see LoadCheckpoint) and returns them with the index's weight map (nil
// without an index). The shards it returns are open even on error.
func openCheckpoint(path string) ([]*shard, map[string]string, error) {
	f, fi, err := prefixed(regfile.Open(path))
	if err != nil && !errors.Is(err, fs.ErrInvalid) {
		return nil, nil, err
	}
	if err == nil && filepath.Base(path) != indexName { // one shard
		s := &shard{name: filepath.Base(path), f: f, fi: fi, lp: openedPath(f, fi, path)}
		s.h, err = Parse(f, fi.Size())
		return []*shard{s}, nil, err
	}
	if err == nil { // an index
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxIndexSize+1))
		if err != nil {
			return nil, nil, fmt.Errorf("safetensors: reading %s: %w", path, err)
		}
		weights, names, err := parseIndex(b)
		if err != nil {
			return nil, nil, fmt.Errorf("safetensors: %s: %w", path, err)
		}
		shards, err := openShards(filepath.Dir(path), names)
		return shards, weights, err
	}
	if dfi, serr := os.Stat(path); serr != nil || !dfi.IsDir() {
		return nil, nil, err // neither a regular file nor a directory
	}
	if _, serr := os.Stat(filepath.Join(path, indexName)); serr == nil {
		return openCheckpoint(filepath.Join(path, indexName))
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, nil, fmt.Errorf("safetensors: %w", err)
	}
	var names []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".safetensors") {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return nil, nil, fmt.Errorf("safetensors: %s holds no index and no .safetensors file: %w", path, fs.ErrNotExist)
	}
	shards, err := openShards(path, names)
	return shards, nil, err
}

// openShards opens and parses the named shards inside dir, through an
// os.Root so that no name (nor a symbolic link) reaches outside it.
func openShards(dir string, names []string) ([]*shard, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer root.Close()
	var shards []*shard
	for _, name := range slices.Sorted(slices.Values(names)) {
		f, fi, err := prefixed(regfile.OpenIn(root, filepath.FromSlash(name)))
		if err != nil {
			return shards, fmt.Errorf("safetensors: shard %s of %s: %w", quote(name), dir, err)
		}
		shards = append(shards, &shard{name: name, f: f, fi: fi, lp: openedPath(f, fi, filepath.Join(dir, name))})
		if shards[len(shards)-1].h, err = Parse(f, fi.Size()); err != nil {
			return shards, fmt.Errorf("safetensors: shard %s: %w", quote(name), err)
		}
	}
	return shards, nil
}

// prefixed returns what regfile's open returned, its error prefixed.
func prefixed(f *os.File, fi os.FileInfo, err error) (*os.File, os.FileInfo, error) {
	if err != nil {
		return nil, nil, fmt.Errorf("safetensors: %w", err)
	}
	return f, fi, nil
}
