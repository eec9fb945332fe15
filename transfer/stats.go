package transfer

import (
	"fmt"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cpuclock"
	"github.com/pinmem/pinmem/transfer/internal/regcache"
)

// Direction is the direction of a copy.
type Direction uint8

// Directions.
const (
	HostToDevice Direction = iota
	DeviceToHost
)

// String returns "host-to-device" or "device-to-host".
func (d Direction) String() string {
	if d == DeviceToHost {
		return "device-to-host"
	}
	return "host-to-device"
}

// Stats describe one transfer, and say which path it took: DirectBytes
// were copied directly from or to pinned memory, StagedBytes went through
// Stages pinned stages (one stage when Stages is 1 and the transfer was
// not larger than a stage, else the ring).
type Stats struct {
	Direction   Direction
	Bytes       int64         // bytes moved
	StagedBytes int64         // of which through the pinned stages
	DirectBytes int64         // of which directly from or to pinned memory
	Stages      int           // staged chunks
	Wall        time.Duration // from the call until the data was in place
	// Device, CopyCPU and ProcessCPU are measured only with
	// WithStats(true), else zero. Device is the stream time between the
	// transfer's first and last operation (zero when the driver could not
	// time it); CopyCPU the copy goroutines' CPU time moving bytes between
	// Go memory and the stages (wall time where thread CPU time is not
	// available); ProcessCPU the whole process's CPU time during the
	// transfer, exact only when nothing else ran.
	Device, CopyCPU, ProcessCPU time.Duration
}

// GBps returns the transfer's speed in GB/s (10^9 bytes per second) of wall time.
func (s Stats) GBps() float64 { return gbps(float64(s.Bytes), s.Wall) }

// gbps is bytes per second of wall time, in 10^9 (0 without time).
func gbps(bytes float64, wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return bytes / wall.Seconds() / 1e9
}

// CPUPerGB returns the process CPU-seconds spent per GB moved (zero
// without WithStats(true)).
func (s Stats) CPUPerGB() float64 { return perGB(s.ProcessCPU, s.Bytes) }

// perGB is d per 10^9 of n bytes (0 without bytes).
func perGB(d time.Duration, n int64) float64 {
	if n <= 0 {
		return 0
	}
	return d.Seconds() / (float64(n) / 1e9)
}

// String summarises the transfer: bytes, path, time, GB/s and CPU-s/GB.
// On cudatest's fake driver, which has no timing model, it says "no timing
// on the fake" instead of rates.
func (s Stats) String() string {
	if cuda.Fake() {
		return fmt.Sprintf("%s %d bytes (%d staged in %d stages, %d direct): no timing on the fake",
			s.Direction, s.Bytes, s.StagedBytes, s.Stages, s.DirectBytes)
	}
	return fmt.Sprintf("%s %d bytes (%d staged in %d stages, %d direct) in %v: %.2f GB/s, %.3f CPU-s/GB (copy %.3f)",
		s.Direction, s.Bytes, s.StagedBytes, s.Stages, s.DirectBytes, s.Wall, s.GBps(), s.CPUPerGB(), perGB(s.CopyCPU, s.Bytes))
}

// meter measures a transfer's wall time and, with cpu, its process CPU time.
type meter struct {
	t0   time.Time
	cpu  bool
	cpu0 time.Duration
}

// startMeter starts a meter; cpu: measure process CPU time too.
func startMeter(cpu bool) meter {
	m := meter{t0: time.Now(), cpu: cpu}
	if cpu {
		m.cpu0 = cpuclock.Process()
	}
	return m
}

// stop sets s's Wall and ProcessCPU.
func (m meter) stop(s *Stats) { s.Wall, s.ProcessCPU = m.elapsed() }

// elapsed returns the wall and (with cpu) process CPU time since start.
func (m meter) elapsed() (wall, cpu time.Duration) {
	wall = time.Since(m.t0)
	if m.cpu {
		cpu = cpuclock.Process() - m.cpu0
	}
	return wall, cpu
}

// CacheStats are a registration cache's counters (WithRegistrationCache):
// Entries (live registrations), Bytes (registered), Hits (requests fully
// served by existing registrations), Misses (the others: they needed a new
// registration, or one was still being made), Registrations and Failures (pinmem.Register calls that
// succeeded and failed; the memory of a failure was staged), Merges
// (registrations that replaced overlapping idle ones), Evictions
// (registrations released to make room, for the limit or the budget) and
// Reclaimed (bytes released because pinmem's budget asked). It is the
// cache's own type.
type CacheStats = regcache.Stats
