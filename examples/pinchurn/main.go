// Command pinchurn pins many buffers of random sizes, the way a long-running
// service does: 1,000 buffers from 1 byte to 1 MiB (most of them small),
// with every allocation method (pinmem.Alloc with MethodAuto,
// MethodHostAlloc and MethodMmapRegister, and pinmem.Register of Go
// slices) and every flag each one takes, freed in random order while new
// ones are pinned. Every fourth buffer goes to the GPU and back through a
// transfer.Copier, by way of a pool.Pool block of the same size: the buffer
// to the device, the device into the block, the block (rewritten) to the
// device, and the device back into the buffer.
//
// Every byte is checked: each buffer's own contents before it is freed (no
// neighbour wrote into it; the driver places small pinned allocations side
// by side in shared pages), and each round trip in both directions. At the
// end the ledger (pinmem.Stats) must be back where it was, and so must the
// driver objects pinmem holds. It prints one line. On a machine without an
// NVIDIA driver or GPU it prints one line saying so and exits with status
// 3, as the pinmem command does.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"reflect"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/pool"
	"github.com/pinmem/pinmem/transfer"
)

func main() {
	n := flag.Int("n", 1000, "buffers to pin")
	seed := flag.Uint64("seed", 1, "seed of the sizes, methods and order")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, *n, *seed); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "pinchurn: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		}
		fmt.Fprintln(os.Stderr, "pinchurn:", err)
		os.Exit(1)
	}
}

// way is one way of pinning: a method of Alloc, or Register (register).
type way struct {
	method   pinmem.Method
	register bool
	flags    pinmem.Flags
}

func (w way) String() string {
	if w.register {
		return "register/" + w.flags.String()
	}
	return w.method.String() + "/" + w.flags.String()
}

// ways are every method with every flag it takes (WriteCombined only from
// cuMemHostAlloc, ReadOnly only by registration).
func ways() []way {
	var out []way
	for _, f := range []pinmem.Flags{0, pinmem.Portable, pinmem.Mapped, pinmem.Portable | pinmem.Mapped, pinmem.WriteCombined, pinmem.ReadOnly} {
		for _, m := range []pinmem.Method{pinmem.MethodAuto, pinmem.MethodHostAlloc, pinmem.MethodMmapRegister} {
			if (f&pinmem.WriteCombined != 0 && m == pinmem.MethodMmapRegister) || (f&pinmem.ReadOnly != 0 && m == pinmem.MethodHostAlloc) {
				continue
			}
			out = append(out, way{method: m, flags: f})
		}
		if f&pinmem.WriteCombined == 0 {
			out = append(out, way{register: true, flags: f})
		}
	}
	return out
}

// live is a pinned buffer and the byte its contents are made from.
type live struct {
	b    *pinmem.Buffer
	w    way
	seed byte
}

// fill writes the pattern of seed into p.
func fill(p []byte, seed byte) {
	for i := range p {
		p[i] = byte(i*7) ^ seed
	}
}

// check returns an error naming the first byte of p that is not the pattern of seed.
func check(p []byte, seed byte, what string) error {
	for i, v := range p {
		if want := byte(i*7) ^ seed; v != want {
			return fmt.Errorf("%s: byte %d of %d is %#x, want %#x", what, i, len(p), v, want)
		}
	}
	return nil
}

// result is what churn did.
type result struct {
	pinned, ways, trips int
	stillLive, stillGo  int   // buffers live at the end of the pinning loop, Go slices among them
	checked             int64 // bytes checked
	unsupported         int   // ways the device does not support
}

func run(ctx context.Context, w io.Writer, n int, seed uint64) error {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}
	before := pinmem.Stats()
	res, err := churn(ctx, gpu, n, seed)
	if err != nil {
		return err
	}
	after := pinmem.Stats()
	if after.Pinned != before.Pinned {
		return fmt.Errorf("ledger after freeing everything: %+v, before: %+v", after.Pinned, before.Pinned)
	}
	if after.Objects != before.Objects {
		return fmt.Errorf("driver objects after closing everything: %+v, before: %+v", after.Objects, before.Objects)
	}
	skipped := ""
	if res.unsupported > 0 {
		skipped = fmt.Sprintf("; %d ways not supported by the device", res.unsupported)
	}
	fmt.Fprintf(w, "pinchurn: %d buffers pinned in %d ways (%d still live at the end, %d of them Go slices, freed in random order), %d round trips through pool blocks, %d bytes checked; ledger back to %d bytes in %d buffers%s\n",
		res.pinned, res.ways, res.stillLive, res.stillGo, res.trips, res.checked, after.Pinned.Bytes, after.Pinned.Buffers, skipped)
	return nil
}

// churn pins n buffers, frees them, and closes what it opened.
func churn(ctx context.Context, gpu *cuda.Context, n int, seed uint64) (res result, err error) {
	c, err := transfer.New(gpu)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, c.Close(ctx)) }()
	p, err := pool.New(pool.WithName("pinchurn"))
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, p.Close(ctx)) }()
	d, err := gpu.Alloc(1 << 20)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, d.Free()) }()

	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	all := ways()
	unsupported := map[string]bool{}
	var bufs []live
	// free checks a buffer's bytes and frees it.
	free := func(l live) error {
		if err := check(l.b.Bytes(), l.seed, fmt.Sprintf("%s buffer of %d bytes before Free", l.w, l.b.Len())); err != nil {
			return err
		}
		res.checked += int64(l.b.Len())
		return l.b.Free()
	}
	defer func() {
		// On an error, release what is still pinned (its bytes unchecked).
		for _, l := range bufs {
			err = errors.Join(err, l.b.Free())
		}
	}()
	for i := range n {
		wy := all[i%len(all)]
		size := min(1+int(r.Int64N(1<<r.IntN(21))), 1<<20) // log-uniform: 1 B to 1 MiB, most of them small
		var b *pinmem.Buffer
		if wy.register {
			b, err = pinmem.Register(goSlice(size, wy.flags), wy.flags)
		} else {
			b, err = pinmem.Alloc(size, wy.flags, pinmem.WithMethod(wy.method))
		}
		if errors.Is(err, cuda.ErrNotSupported) {
			unsupported[wy.String()] = true // the device lacks the flag or the method
			continue
		}
		if err != nil {
			return res, fmt.Errorf("buffer %d, %s, %d bytes, with %d live: %w", i, wy, size, len(bufs), err)
		}
		res.pinned++
		l := live{b: b, w: wy, seed: byte(r.Uint32())}
		fill(b.Bytes(), l.seed)
		if i%4 == 0 {
			if err := roundTrip(ctx, c, p, d, l); err != nil {
				return res, fmt.Errorf("round trip of buffer %d (%s, %d bytes): %w", i, wy, size, err)
			}
			if wy.flags&pinmem.ReadOnly == 0 {
				l.seed = ^l.seed // the buffer now holds the block's pattern
			}
			res.trips++
			res.checked += 2 * int64(size)
		}
		bufs = append(bufs, l)
		// Free one at random about every other buffer, so that frees
		// interleave with pins and the live set keeps growing.
		if r.IntN(2) == 0 {
			k := r.IntN(len(bufs))
			l := bufs[k]
			bufs[k] = bufs[len(bufs)-1]
			bufs = bufs[:len(bufs)-1]
			if err := free(l); err != nil {
				return res, err
			}
		}
	}
	res.stillLive = len(bufs)
	for _, l := range bufs {
		if l.w.register {
			res.stillGo++
		}
	}
	r.Shuffle(len(bufs), func(i, j int) { bufs[i], bufs[j] = bufs[j], bufs[i] })
	for len(bufs) > 0 {
		l := bufs[len(bufs)-1]
		bufs = bufs[:len(bufs)-1]
		if err := free(l); err != nil {
			return res, err
		}
	}
	res.ways, res.unsupported = len(all)-len(unsupported), len(unsupported)
	return res, nil
}

// goSlice returns a Go slice of size bytes to register with flags. Small
// Go slices may share a page, and two registrations may share a page
// unless one is read-only and the other not: the driver refuses that
// (pinmem says so with an error matching cuda.ErrInvalidValue). So a
// read-only one gets pages of its own.
func goSlice(size int, flags pinmem.Flags) []byte {
	if flags&pinmem.ReadOnly == 0 {
		return make([]byte, size)
	}
	page := os.Getpagesize()
	mem := make([]byte, (size+page-1)/page*page+page)
	o := int(-reflect.ValueOf(mem).Pointer() & uintptr(page-1)) // to the first page boundary
	return mem[o : o+size : o+size]
}

// roundTrip sends l's buffer to the device and into a pool block of the
// same size, checks the block, rewrites it with the inverted pattern and
// sends it back through the device into the buffer (not into a read-only
// one, which the device may not write), and checks the buffer.
func roundTrip(ctx context.Context, c *transfer.Copier, p *pool.Pool, d *cuda.DeviceBuffer, l live) (err error) {
	size := l.b.Len()
	dst, err := d.Slice(0, size)
	if err != nil {
		return err
	}
	blk, err := p.Get(ctx, size)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, p.Put(blk)) }()
	if _, err := c.HtoD(ctx, dst, l.b.Bytes()); err != nil {
		return err
	}
	if _, err := c.DtoH(ctx, blk.Bytes(), dst); err != nil {
		return err
	}
	if err := check(blk.Bytes(), l.seed, "the pool block after buffer -> device -> block"); err != nil {
		return err
	}
	if l.w.flags&pinmem.ReadOnly != 0 {
		return nil
	}
	fill(blk.Bytes(), ^l.seed)
	if _, err := c.HtoD(ctx, dst, blk.Bytes()); err != nil {
		return err
	}
	if _, err := c.DtoH(ctx, l.b.Bytes(), dst); err != nil {
		return err
	}
	return check(l.b.Bytes(), ^l.seed, "the buffer after block -> device -> buffer")
}
