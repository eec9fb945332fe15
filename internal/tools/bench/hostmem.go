package bench

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// hostMem is host memory of one kind.
type hostMem struct {
	kind string
	b    []byte
	buf  *pinmem.Buffer // nil for Go heap memory (pageable, pageable-sync, copier kinds)
	dptr cuda.DevicePtr // device pointer of mapped memory
}

// allocHost returns n bytes of host memory of the given kind.
func (s *Session) allocHost(kind string, n int) (*hostMem, error) {
	h := &hostMem{kind: kind}
	dev := pinmem.WithDevice(s.Dev)
	hostAlloc := pinmem.WithMethod(pinmem.MethodHostAlloc)
	var err error
	switch kind {
	case KindPageable, KindPageableSync, KindCopier:
		h.b = make([]byte, n)
		return h, nil
	case KindPinned:
		h.buf, err = pinmem.Alloc(n, 0, dev, hostAlloc)
	case KindPortable:
		h.buf, err = pinmem.Alloc(n, pinmem.Portable, dev, hostAlloc)
	case KindWriteCombined:
		h.buf, err = pinmem.Alloc(n, pinmem.WriteCombined, dev, hostAlloc)
	case KindMmapRegister:
		h.buf, err = pinmem.Alloc(n, 0, dev, pinmem.WithMethod(pinmem.MethodMmapRegister))
	case KindGoRegister:
		heap := make([]byte, n)
		h.buf, err = pinmem.Register(heap, 0, dev)
	case KindMapped:
		h.buf, err = pinmem.Alloc(n, pinmem.Mapped, dev, hostAlloc)
		if err == nil {
			h.dptr, err = h.buf.DevicePtr()
			if err != nil {
				_ = h.buf.Free()
				return nil, err
			}
		}
	default:
		return nil, invalid("unknown kind %q", kind)
	}
	if err != nil {
		return nil, err
	}
	h.b = h.buf.Bytes()
	return h, nil
}

func (h *hostMem) free() error {
	if h == nil || h.buf == nil {
		return nil
	}
	err := h.buf.Free()
	h.buf, h.b = nil, nil
	return err
}

// randomBytes returns n random bytes from a seeded generator.
func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// Poison bytes written to destinations before a verified sample.
const (
	poisonHost   = 0x5A
	poisonDevice = 0xA5
)

func poison(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// sumWords returns the sum modulo 2^64 of b's little-endian 32-bit words,
// what read_sum_u32 computes (kernels.Sum). len(b) must be a multiple of 4.
func sumWords(b []byte) uint64 {
	var sum uint64
	for i := 0; i+4 <= len(b); i += 4 {
		sum += uint64(binary.LittleEndian.Uint32(b[i:]))
	}
	return sum
}

// firstDiff returns the index of the first differing byte, or -1.
func firstDiff(a, b []byte) int {
	n := min(len(a), len(b))
	const blk = 1 << 16
	for off := 0; off < n; off += blk {
		end := min(off+blk, n)
		if string(a[off:end]) != string(b[off:end]) {
			for i := off; i < end; i++ {
				if a[i] != b[i] {
					return i
				}
			}
		}
	}
	if len(a) != len(b) {
		return n
	}
	return -1
}
