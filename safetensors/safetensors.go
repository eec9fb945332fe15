// Package safetensors reads and writes the header of the safetensors file
// format, the format model weights are shipped in, with bounds checks: a
// malformed, truncated or malicious file is an error wrapping ErrFormat,
// never a panic, an out-of-bounds read or an allocation beyond a small
// multiple of the (capped) header length.
//
// A safetensors file is an 8-byte little-endian unsigned header length N,
// then N bytes of UTF-8 JSON, then the data region. The JSON is one object
// whose keys are tensor names, each mapped to
//
//	{"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
//
// where begin and end are byte offsets into the data region (relative to
// the byte after the header), plus an optional "__metadata__" key mapped to
// an object of string values.
//
// Parse is strict. It accepts a file only when all of these hold:
//   - N is at most MaxHeaderSize and the header lies inside the file;
//   - the header is valid UTF-8, begins with '{' and holds one JSON object
//     followed by nothing but JSON whitespace (writers pad with spaces);
//   - no key appears twice: tensor names, metadata keys and the fields of
//     one tensor entry are each unique (encoding/json alone would keep the
//     last of duplicates silently);
//   - "__metadata__" is null or an object whose values are strings;
//   - each tensor entry is an object with exactly the fields dtype, shape
//     and data_offsets, spelled in lower case (no other field);
//   - dtype is one of the DType constants (the sub-byte types F4, F6_E2M3
//     and F6_E3M2 are not supported and are rejected);
//   - shape is an array of at most MaxRank non-negative JSON integers (no
//     fraction, no exponent); the running product of the dimensions, taken
//     left to right, and the byte length (elements times ElemSize) each fit
//     in an int64;
//   - data_offsets is an array of exactly two non-negative integers with
//     begin <= end and end - begin equal to the byte length;
//   - the tensors, sorted by (begin, end), tile the data region exactly: the
//     first begins at 0, each begins where the one before ends (no overlap
//     and no gap, a zero-length tensor included), and the file ends where
//     the last tensor ends (no trailing bytes).
//
// The tiling rule is the reference implementation's: it lets a loader
// read the whole data region as one range and place each tensor at its
// offset, knowing every byte belongs to exactly one tensor.
//
// # Loading to the GPU
//
// LoadAll reads every tensor of a file into one device allocation, each at
// its offset in the data region (Tensors.Tensor returns a view of one);
// Load puts each tensor into a buffer that a callback chooses, or leaves
// it out. Both read with a load.Loader (package
// github.com/pinmem/pinmem/load): parallel reads into pinned stages,
// asynchronous copies, direct I/O for files that are not in the page
// cache. The header is parsed and checked before anything is allocated
// or read, so a malformed file costs no device memory.
//
// LoadCheckpoint loads a checkpoint as it is published: one file, a
// directory of shards, or a sharded checkpoint's index
// (model.safetensors.index.json). The shards are read in parallel under
// the Loader's one pinned budget, a callback announces each tensor as
// soon as it is on the device, and a part function chooses what of each
// tensor to load and where (all of it, a rank's slice, or nothing).
package safetensors

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxHeaderSize is the largest header length Parse accepts, 10^8 bytes,
// the limit of the reference implementation. It bounds what Parse
// allocates whatever the file claims.
const MaxHeaderSize = 100_000_000

// maxHeaderSize is the limit in force: MaxHeaderSize, lowered by tests so
// that checking the limit does not take hundreds of megabytes.
var maxHeaderSize int64 = MaxHeaderSize

// MaxRank is the largest number of dimensions a tensor's shape may have
// (NumPy's limit). Without it a header of "[0,0,0,...]" would make one
// shape as long as the header.
const MaxRank = 64

// metadataKey is the reserved top-level key that holds the file's metadata.
const metadataKey = "__metadata__"

// ErrFormat is matched (errors.Is) by every error that reports a malformed
// file; the error is a *FormatError saying what is wrong and where.
var ErrFormat = errors.New("safetensors: malformed file")

// ErrInvalid is matched (errors.Is) by every error that reports a bad
// argument: a nil reader, a negative size, or a Write of tensors that would
// not make a valid file.
var ErrInvalid = errors.New("safetensors: invalid argument")

// FormatError describes why a file is malformed. It wraps ErrFormat.
type FormatError struct {
	// Offset is the file offset at or near which the problem was found
	// (inside the header for JSON problems, 0 for the length prefix), or
	// -1 where no single place applies (a gap between tensors).
	Offset int64
	// Reason says what is wrong, naming the tensor concerned if any.
	Reason string
}

// Error returns the reason and the offset.
func (e *FormatError) Error() string {
	if e.Offset < 0 {
		return "safetensors: malformed file: " + e.Reason
	}
	return fmt.Sprintf("safetensors: malformed file: %s (at byte %d)", e.Reason, e.Offset)
}

// Unwrap returns ErrFormat.
func (e *FormatError) Unwrap() error { return ErrFormat }

func formatErr(off int64, format string, args ...any) error {
	return &FormatError{Offset: off, Reason: fmt.Sprintf(format, args...)}
}

// quote quotes a name for an error message, shortened so that a huge name
// does not make a huge message.
func quote(name string) string {
	const max = 64
	if len(name) > max {
		cut := max
		for cut > 0 && !isRuneStart(name[cut]) {
			cut--
		}
		return strconv.Quote(name[:cut]) + "..."
	}
	return strconv.Quote(name)
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// DType is a tensor's element type, spelled as in the file ("F32").
type DType string

// The element types Parse accepts, each spelled as in the file.
const (
	Bool   DType = "BOOL"
	U8     DType = "U8"
	I8     DType = "I8"
	F8E5M2 DType = "F8_E5M2"
	F8E4M3 DType = "F8_E4M3"
	F8E8M0 DType = "F8_E8M0"
	I16    DType = "I16"
	U16    DType = "U16"
	F16    DType = "F16"
	BF16   DType = "BF16"
	I32    DType = "I32"
	U32    DType = "U32"
	F32    DType = "F32"
	F64    DType = "F64"
	I64    DType = "I64"
	U64    DType = "U64"
	C64    DType = "C64"
)

// dtypes lists every supported DType, for tests and error messages.
var dtypes = []DType{Bool, U8, I8, F8E5M2, F8E4M3, F8E8M0, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, C64}

// ElemSize returns the size of one element in bytes, or 0 for a DType that
// is not one of the constants (matching is exact: "f32" is not F32).
func (d DType) ElemSize() int {
	switch d {
	case Bool, U8, I8, F8E5M2, F8E4M3, F8E8M0:
		return 1
	case I16, U16, F16, BF16:
		return 2
	case I32, U32, F32:
		return 4
	case F64, I64, U64, C64:
		return 8
	}
	return 0
}

// Tensor is one tensor of a file: its name, element type, shape and the
// byte range [Begin, End) of its data, as absolute file offsets.
type Tensor struct {
	Name  string
	DType DType
	// Shape lists the dimensions; an empty shape is a scalar (one element).
	Shape []int64
	// Begin and End are absolute file offsets: the tensor's data is the
	// bytes [Begin, End) of the file.
	Begin, End int64
}

// Size returns the length of the tensor's data in bytes, End - Begin. For
// tensors from Parse or Write it is the product of Shape (1 for a scalar)
// times DType.ElemSize, and that product does not overflow.
func (t Tensor) Size() int64 { return t.End - t.Begin }

// Header is a parsed safetensors header.
type Header struct {
	// Tensors are sorted by (Begin, End, Name); they tile [DataStart,
	// DataEnd) without gap or overlap.
	Tensors []Tensor
	// Metadata is the "__metadata__" object; nil when the file has none.
	Metadata map[string]string
	// DataStart is the file offset of the data region, 8 + the header
	// length; tensor offsets in the file are relative to it.
	DataStart int64
	// DataEnd is the end of the data region: the end of the last tensor,
	// DataStart for a file without tensors, and the file's size.
	DataEnd int64

	index map[string]int // name -> position in Tensors
}

// Lookup returns the tensor named name and whether there is one.
func (h *Header) Lookup(name string) (Tensor, bool) {
	if h == nil {
		return Tensor{}, false
	}
	if h.index != nil {
		i, ok := h.index[name]
		if ok && i < len(h.Tensors) && h.Tensors[i].Name == name {
			return h.Tensors[i], true
		}
	}
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// sortTensors orders tensors as Header.Tensors documents and builds the
// name index.
func sortTensors(ts []Tensor) map[string]int {
	slices.SortFunc(ts, func(a, b Tensor) int {
		if a.Begin != b.Begin {
			return cmpInt(a.Begin, b.Begin)
		}
		if a.End != b.End {
			return cmpInt(a.End, b.End)
		}
		return strings.Compare(a.Name, b.Name)
	})
	index := make(map[string]int, len(ts))
	for i, t := range ts {
		index[t.Name] = i
	}
	return index
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// byteLen returns the number of elements of shape and their size in bytes
// for dtype d, or a non-empty reason when a dimension is negative, d is not
// supported, or the running product or the byte length overflows int64.
func byteLen(shape []int64, d DType) (elems, bytes int64, reason string) {
	elems = 1
	for i, dim := range shape {
		if dim < 0 {
			return 0, 0, fmt.Sprintf("shape dimension %d is negative (%d)", i, dim)
		}
		if dim != 0 && elems > (1<<63-1)/dim {
			return 0, 0, fmt.Sprintf("shape %v: element count overflows int64", shape)
		}
		elems *= dim
	}
	size := int64(d.ElemSize())
	if size == 0 {
		return 0, 0, fmt.Sprintf("unknown dtype %s", quote(string(d)))
	}
	if elems > (1<<63-1)/size {
		return 0, 0, fmt.Sprintf("shape %v of %s: byte length overflows int64", shape, d)
	}
	return elems, elems * size, ""
}
