package bench

import "github.com/pinmem/pinmem/cuda"

// memsetPrefix sets the first n bytes of b to v, synchronously.
func memsetPrefix(b *cuda.DeviceBuffer, v byte, n int) error {
	p, err := b.Slice(0, n)
	if err != nil {
		return err
	}
	return p.Memset(v)
}
