package transfer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pinmem/pinmem/cuda"
)

// DefaultCalibrationMax is the largest transfer Calibrate measures unless
// told otherwise: 256 MiB.
const DefaultCalibrationMax = 256 << 20

// calibrationMin is the smallest transfer Calibrate measures.
const calibrationMin = 64 << 10

// Calibrate measures, on context c, a Copier's short path (one pinned
// stage, the Copier's path below its Thresholds) against its staged path (a Copier made with opts) for Go slices
// of 64 KiB, 256 KiB, ... up to maxSize bytes (0: DefaultCalibrationMax),
// both ways, with interleaved samples, and returns for each direction the
// smallest measured size from which the staged path is faster at that
// size and every larger one: the thresholds to pass to WithThresholds.
// When the short path wins up to maxSize, the threshold is 2*maxSize;
// when staging wins from the smallest size on, it is 0.
//
// Calibrate takes a few hundred milliseconds to a few seconds (it copies
// about 40 times maxSize bytes) and needs maxSize bytes of device memory
// and of Go memory, and the Copier's staging ring; run it once per host
// and store the result (Thresholds marshal to JSON). The numbers are
// wall times of whole transfers, so run it on an otherwise idle device.
// A maxSize below 64 KiB or above 16 GiB is refused with an error
// matching cuda.ErrInvalidValue; ctx bounds the run.
func Calibrate(ctx context.Context, c *cuda.Context, maxSize int, opts ...Option) (Thresholds, error) {
	if err := checkCtx(ctx); err != nil {
		return Thresholds{}, err
	}
	if maxSize == 0 {
		maxSize = DefaultCalibrationMax
	}
	if maxSize < calibrationMin || maxSize > 16<<30 {
		return Thresholds{}, fmt.Errorf("transfer: Calibrate up to %d bytes: must be 64 KiB to 16 GiB: %w", maxSize, cuda.ErrInvalidValue)
	}
	cp, err := New(c, opts...)
	if err != nil {
		return Thresholds{}, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err = errors.Join(err, cp.Close(cctx))
	}()
	dev, err := c.Alloc(maxSize)
	if err != nil {
		return Thresholds{}, fmt.Errorf("transfer: Calibrate: %w", err)
	}
	defer func() { err = errors.Join(err, dev.Free()) }()
	host := make([]byte, maxSize)
	for i := range host {
		host[i] = byte(i * 7)
	}
	var sizes []int
	for n := calibrationMin; n < maxSize; n *= 4 {
		sizes = append(sizes, n)
	}
	sizes = append(sizes, maxSize)
	var t Thresholds
	for _, d := range []Direction{HostToDevice, DeviceToHost} {
		wins := make([]bool, len(sizes))
		for i, n := range sizes {
			drv, stg, err := cp.compare(ctx, d, dev, host[:n], calibrationSamples(n))
			if err != nil {
				return Thresholds{}, err
			}
			wins[i] = stg < drv
		}
		thr := int64(2 * maxSize)
		for i := len(sizes) - 1; i >= 0 && wins[i]; i-- {
			thr = int64(sizes[i])
		}
		if thr == calibrationMin {
			thr = 0
		}
		if d == HostToDevice {
			t.HtoD = thr
		} else {
			t.DtoH = thr
		}
	}
	return t, nil
}

// calibrationSamples is the number of samples per strategy for n bytes:
// more for small transfers, whose times scatter more.
func calibrationSamples(n int) int {
	switch {
	case n <= 4<<20:
		return 15
	case n <= 64<<20:
		return 7
	}
	return 3
}

// compare times k transfers of host in direction d through the short
// path and k through the stages, interleaved, and returns the
// median of each.
func (c *Copier) compare(ctx context.Context, d Direction, dev *cuda.DeviceBuffer, host []byte, k int) (driver, staged time.Duration, err error) {
	var dt, st []time.Duration
	for i := 0; i < k; i++ {
		for _, how := range []strategy{forceShort, forceStaged} {
			t0 := time.Now()
			var err error
			if d == HostToDevice {
				_, err = c.htod(ctx, dev, host, how)
			} else {
				_, err = c.dtoh(ctx, host, dev, how)
			}
			if err != nil {
				return 0, 0, fmt.Errorf("transfer: Calibrate: %w", err)
			}
			if how == forceShort {
				dt = append(dt, time.Since(t0))
			} else {
				st = append(st, time.Since(t0))
			}
		}
	}
	return medianDur(dt), medianDur(st), nil
}

func medianDur(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}
