// Package transfer moves data between Go memory and CUDA devices through
// pinned memory, and overlaps copies with device work. The repository's
// README and docs/PERF.md give a Copier's measured rate as a ratio to
// pinned memory's, with the device and commit it was measured on.
//
// A Copier belongs to one CUDA context and moves each part of the host
// memory the fastest way measured for its direction and size: memory
// already pinned (by pinmem, made known with AddPinned, or held by the
// registration cache) directly, one driver copy per registration;
// ordinary (pageable) Go memory through one pinned stage up to 32 MiB and
// above that through a ring of pinned stages, CPU goroutines filling one
// stage while the copy engine drains another. The stages and copy
// goroutines are a staging engine shared by the context's Copiers (see
// Copier). Partly pinned memory follows one rule in every call (a
// transfer, each chunk of a Pipeline Run, a Broadcast's source): its
// pinned parts are copied directly and only the parts between them are
// staged. Stats says which path each transfer took. The driver's own
// pageable copy is never used: it cannot be interrupted, so it would
// outlive a call whose context ended.
//
// There is one way to do each copy: HtoD and DtoH copy a byte slice and
// return when the data is in place; HtoDAsync and DtoHAsync start them and
// return an *Op; HtoDFrom and DtoHTo stream an io.Reader into device
// memory and device memory into an io.Writer through the pinned stages,
// with no extra heap copy. AsBytes turns a slice of numbers into bytes.
//
// Every blocking call takes a context.Context first (nil is refused with an
// error matching cuda.ErrInvalidValue) and returns when it ends, within
// the driver call in progress (a copy enqueue or an event query, which do
// not wait for the device), with an error matching ctx.Err(); a cancelled
// transfer never reports success. Every call keeps these rules, success
// or error:
//
//   - A caller's pageable Go slice is never read or written after the
//     call returns: only the CPU copies into and out of the pinned
//     stages touch it, on the call's own time.
//   - Copies already queued when a call returns early (its context ended,
//     a callback panicked, an enqueue or a wait failed) are not waited for: they
//     are handed to the Copier's fence, which keeps their lane and stages
//     until they ran (on a hung device, for ever) and queues every later
//     copy of the Copier, its Pipelines and its Multi behind them on the
//     device, so a retry is never overwritten by an attempt that timed
//     out.
//   - Pinned memory copied directly may be touched by those copies until
//     they ran: after an error, call Copier.Fence (Multi.Fence), bounded
//     by its context, before reusing it (freeing it, putting a pool block
//     back, handing it to another call). An Op waits for them itself,
//     bounded by its context; an Op of pageable memory is done as soon as
//     its CPU copies stopped.
//   - Every wait is bounded by the caller's context, and a wait on a
//     caller's stream (WithStream, RunMapped) waits for the call's own
//     work only, never for work queued on that stream afterwards.
//   - A Pipeline's Done or work callback that panics is recovered on the
//     goroutine that ran it, the Run's chunks in flight are handed to the
//     fence, and the panic is raised again on Run's caller.
//
// Close(ctx) of a Copier, Pipeline or Multi closes it to new calls (they
// return ErrClosed), waits for the calls in progress and the copies they
// left queued, and releases what it holds. The wait is bounded by ctx:
// when ctx ends first, Close returns an error matching ctx.Err(), the
// owner stays closed and is released in the background once its copies
// ran (on a hung device, never). A release the driver fails keeps the
// object held (and counted by pinmem and cuda) and returns the error; a
// later Close waits again, bounded by its own ctx, and retries it, as
// does the package's next constructor (or another owner's of pinmem).
// Once everything is released, Close returns ErrClosed, which matches
// cuda.ErrClosed.
//
// Waiting never holds one OS thread per waiting goroutine: one waiter
// goroutine per lane of a Copier (and per completer of a Pipeline Run)
// sleeps in the driver, everyone else parks on channels. By default
// (WaitHybrid) a transfer sleeps until all but its last piece has run and
// then polls the end, where the driver's wake-up latency would show;
// WaitPoll polls throughout and WaitSleep never polls.
//
// Each transfer returns Stats: bytes, the path taken and wall time.
// WithStats(true) adds the device time (two timing events per transfer)
// and the CPU it cost (thread and process CPU time from getrusage); without
// it a small transfer costs no extra driver or system call.
//
// The registration cache (WithRegistrationCache, off by default) pins
// large slices in place on their first copy, so that a slice copied again
// and again is copied directly, as pinned memory is; Copier.Forget releases a slice's
// registrations before its memory is reused.
//
// A Pipeline runs host-to-device, the caller's device work and
// device-to-host per chunk of a large input, across several streams.
// RunMapped runs a kernel directly on a Mapped pinmem.Buffer (zero-copy):
// every read crosses the bus; measure with `pinmem zerocopy`.
//
// Device buffers are checked before any copy is queued: a freed buffer
// gives an error matching cuda.ErrInvalidHandle, a buffer of another
// device ErrWrongDevice.
//
// A Copier, Pipeline or Multi dropped without Close is counted and
// reported (pinmem.Stats, pinmem.SetLogger) when the garbage collector
// finds it, and released then; until then it keeps what it holds.
//
// # Several GPUs
//
// A Multi serves several contexts at once (every GPU's primary context;
// one GPU, or two contexts of one GPU, work too). Broadcast sends the same
// host data to every device: each chunk is copied once by the CPU into a
// portable stage of the first device's Copier and queued on a lane of
// every device's Copier, so the copies run concurrently and in step; a
// stage is refilled once every device is done with it. Gather and Scatter
// move each device's own data through its own Copier, whose stages pinmem
// places on the device's NUMA node. A source pinned portable is copied
// directly to every device.
//
// # Defaults
//
// 32 MiB stages, 3 per transfer, up to 12 CPU copy goroutines (capped by
// the number of CPUs), one stage up to 32 MiB: pinned copies reach full
// PCIe speed from about 16 MiB, two or three stages in flight keep the
// copy engine busy, Go copies into pinned memory stop scaling at about a
// dozen goroutines, and up to 32 MiB one stage is faster than the ring
// (on an H200, PCIe Gen5 x16). Nothing is pinned until a transfer needs
// it: transfers up to 1 MiB use a 1 MiB stage, larger ones the ring's
// stages (96 MiB for one ring), as Copier says.
package transfer
