// Package transfer moves data between Go memory and CUDA devices at close
// to pinned-memory speed, and overlaps copies with device work.
//
// A Copier belongs to one CUDA context. It owns a ring of pinned staging
// buffers (allocated with pinmem.Alloc), one non-blocking stream and a
// persistent set of CPU copy goroutines. Copying an ordinary (pageable) Go
// slice to the device splits it into stages: while the copy engine drains
// stage k-1 on the Copier's stream, the CPU goroutines fill stage k, each
// stage guarded by its own event. Device-to-host runs the ring the other
// way, with the DMA of later stages running ahead of the CPU copy-out.
// Memory that is already pinned (a pinmem.Buffer made known with AddPinned,
// or a range held by the registration cache) is copied directly, without
// staging.
//
// Every transfer has a synchronous form and an asynchronous one returning a
// *Transfer with Wait and Done. Transfers honour context cancellation: they
// stop issuing work, wait for the DMA already in flight (a stage must not
// be reused, nor a destination reported, while the copy engine still uses
// it), and return an error matching ctx.Err(); a cancelled transfer never
// reports success. Waiting never holds one OS thread per waiting goroutine:
// a Copier has a single waiter goroutine that blocks in the driver on the
// events it is asked about, and everyone else parks on channels. The end
// of a transfer is where the driver's wake-up latency would show, so by
// default (WithWait(WaitHybrid)) a transfer sleeps until all but its last
// piece has run and then polls the end; WaitPoll polls throughout (lowest
// latency, one busy core) and WaitSleep never polls.
//
// Each transfer returns Stats: bytes, wall time, device time, the path
// taken, and the CPU it cost (the copy goroutines' thread CPU time from
// getrusage(RUSAGE_THREAD), and the whole process's CPU time from
// getrusage(RUSAGE_SELF)), as GB/s and CPU-seconds per GB.
//
// ReadFrom and WriteTo stream an io.Reader into device memory and device
// memory into an io.Writer through the pinned stages, with no extra heap
// copy: the reader fills the stage's own bytes (io.ReadFull), and the
// writer is handed them.
//
// The registration cache (WithRegistrationCache, off by default) pins large
// slices in place with pinmem.Register the first time they are copied and
// reuses the registration afterwards, so a slice copied again and again
// moves at pinned speed. It keys registrations by page ranges, shares and
// merges overlapping ranges with reference counts, evicts the least
// recently used idle registrations under its byte limit, and gives memory
// back when pinmem's budget asks (it is a pinmem.Reclaimer).
//
// A Pipeline splits a large input into chunks and runs, for each chunk,
// host-to-device, the caller's device work (a kernel launch or any Go
// callback that enqueues on the chunk's stream) and device-to-host, across
// several streams, with a bounded number of chunks in flight (bounded
// device and pinned memory, back-pressure on the producer), ordered or
// unordered completion callbacks, and cancellation and error propagation
// that stop issuing and drain cleanly.
//
// The zero-copy helpers run a kernel directly on a Mapped pinmem.Buffer's
// device pointer, and CompareZeroCopy measures when that wins over explicit
// copies (data read once) and when it loses (data re-read).
//
// # Several GPUs
//
// A Multi serves several contexts at once (every GPU's primary context;
// one GPU, or two contexts of one GPU, work too). Broadcast sends the same
// host data to every device: each chunk is copied once by the CPU into a
// shared ring of portable pinned stages and then queued on every device's
// own stream, so the copies to different GPUs run concurrently and in step,
// and a stage is refilled only when every device has finished with it.
// Gather brings every device's data to host memory at once and Scatter
// sends different data to each, each device through its own Copier, whose
// staging memory pinmem places on that device's NUMA node on a multi-socket
// host (pinmem.PlanNUMA). A source already pinned portable (AddPinned) is
// copied directly to every device. The shared Broadcast ring is placed on
// the first context's device's node. MultiStats.GBps is the aggregate
// bandwidth over all devices.
//
// Defaults come from the project's measurements (ANCHORS.md, one H200 on
// PCIe Gen5 x16, 16 cores): 32 MiB stages (16-64 MiB were best), 3 stages
// (2-4 deep were best) and 12 CPU copy goroutines (Go copy into pinned
// memory peaks at 12 goroutines, 43.8 GB/s; 16 is slower), capped by the
// number of CPUs.
package transfer
