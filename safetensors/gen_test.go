package safetensors

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// tensorBytes writes the n bytes of tensor i of a generated file: a
// pseudo-random stream seeded by i, the same on every call.
func tensorBytes(w io.Writer, i int, n int64) error {
	r := rand.New(rand.NewPCG(uint64(i), 0x5afe))
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		k := min(n, int64(len(buf)))
		j := int64(0)
		for ; j+8 <= k; j += 8 {
			binary.LittleEndian.PutUint64(buf[j:], r.Uint64())
		}
		if j < k {
			var tail [8]byte
			binary.LittleEndian.PutUint64(tail[:], r.Uint64())
			copy(buf[j:k], tail[:])
		}
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// tensorData returns what tensorBytes writes.
func tensorData(i int, n int64) []byte {
	var b bytesWriter
	_ = tensorBytes(&b, i, n)
	return b.b
}

type bytesWriter struct{ b []byte }

func (w *bytesWriter) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

// modelSpecs returns tensors of several dtypes and shapes, some odd (a
// scalar, an empty tensor, sizes that are not multiples of 8), whose data
// add up to about total bytes: "layers" of an F16 weight of hidden x hidden/2,
// an F32 bias and a BF16 norm.
func modelSpecs(total int64, hidden int64) []Spec {
	specs := []Spec{
		{Name: "embed.ids", DType: I64, Shape: []int64{1001}},
		{Name: "scalar", DType: F64, Shape: []int64{}},
		{Name: "empty", DType: I32, Shape: []int64{0, 3}},
		{Name: "mask", DType: Bool, Shape: []int64{7, 13}},
		{Name: "u8.cube", DType: U8, Shape: []int64{3, 5, 7}},
		{Name: "f8", DType: F8E4M3, Shape: []int64{33, 3}},
	}
	layer := hidden*hidden/2*2 + hidden*4 + hidden*2
	for i := int64(0); i*layer < total || i == 0; i++ {
		specs = append(specs,
			Spec{Name: fmt.Sprintf("layers.%d.weight", i), DType: F16, Shape: []int64{hidden, hidden / 2}},
			Spec{Name: fmt.Sprintf("layers.%d.bias", i), DType: F32, Shape: []int64{hidden}},
			Spec{Name: fmt.Sprintf("layers.%d.norm", i), DType: BF16, Shape: []int64{hidden}},
		)
	}
	specs = append(specs, Spec{Name: "lm_head.u16", DType: U16, Shape: []int64{hidden + 1}})
	for i := range specs {
		i := i
		_, n, _ := byteLen(specs[i].Shape, specs[i].DType)
		specs[i].Data = func(w io.Writer) error { return tensorBytes(w, i, n) }
	}
	return specs
}

// writeModel writes a file of modelSpecs(total, hidden) under dir and
// returns its path, header and the index of each tensor's generator.
func writeModel(t testing.TB, dir string, total, hidden int64) (string, *Header, map[string]int) {
	t.Helper()
	specs := modelSpecs(total, hidden)
	path := filepath.Join(dir, "model.safetensors")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 4<<20)
	h, err := Write(w, specs, map[string]string{"format": "pt"})
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	seed := map[string]int{}
	for i, s := range specs {
		seed[s.Name] = i
	}
	return path, h, seed
}
