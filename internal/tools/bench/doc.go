// Package bench is pinmem's measurement engine: host<->device bandwidth for
// every kind of host memory (pageable, pinned, portable, write-combined,
// registered, mapped zero-copy, staged), the cost of pinning, overlapped
// pipelines, zero-copy against explicit copies, an end-to-end vector-add
// scenario, and scattered block copies by each strategy of blocks.Copier,
// one way against one contiguous copy and both ways at once against the
// bidirectional pinned bound (Session.Blocks, timed with the host clock:
// there the cost of queuing is what differs), with
// reports as aligned text, JSON, CSV and SVG.
//
// # Timing
//
// Copies are timed the way NVIDIA's nvbandwidth times them: a one-thread
// kernel (spin_wait) holds the stream by polling a flag in mapped host
// memory while the start event, the copies and the end event are queued;
// the host then releases the flag, so the time between the events is the
// copies' own, not the cost of queueing them. Every measurement runs a
// warm-up, then several samples, and reports the median, minimum and
// maximum. Data is random, destinations are poisoned first, and every byte
// of the first timed sample is checked.
//
// When the kernels cannot be loaded (the embedded PTX is a placeholder or
// too new for the driver), copies are timed with plain events and each
// result's Timing says so; the kernel-based benches (mapped zero-copy, the
// pipeline's kernel) are skipped with a note. The driver's pageable path
// blocks the calling thread, so pageable copies are always timed with
// plain events (holding the stream would deadlock), and the staged kind,
// which is driven by host goroutines, with the wall clock.
//
// # Several GPUs
//
// Matrix is nvbandwidth's host<->GPU matrix: one row per device (H2D, D2H
// and bidirectional copies between that device and portable pinned host
// memory placed on its NUMA node), then an "all" row with every device
// copying at once, whose figure is the sum of the devices' concurrent
// figures, compared in its note with the sum of the per-device rows.
// WriteMatrix prints it as a matrix; `pinmem bench matrix` runs it.
//
// # Results
//
// Every bench returns a []Result; WriteTable, WriteJSON, WriteCSV and
// WritePlot render them. Units are GB/s (10^9 bytes per second), ms or FPS.
package bench
