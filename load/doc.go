// Package load reads files, or byte ranges of them, into GPU device memory
// through pinned stages, reads and copies overlapped: the way an inference
// server loads many gigabytes of model weights at start-up (pinmem bench
// load measures it against plain reads of the same file).
//
// A Loader holds a fixed set of pinned stages (pinmem.Alloc, charged to
// pinmem's budget, so its pinned memory is bounded and accounted: the
// depth times the stage size) and a few CUDA streams. New pins nothing: a
// stage is pinned by the first read that takes it, once, and stays pinned
// until Close, reused by every later load, which takes the pinned stages
// first: loads of one read pin one stage, and a first load's first range
// waits for its own stage alone. A load splits the ranges into reads of at
// most one stage; several goroutines pread in parallel into free stages,
// and each filled stage is drained by asynchronous host-to-device copies
// (cuda.Stream.CopyHtoD) while the readers fill others. A stage is
// refilled only after the event recorded behind its copies has completed.
//
//	l, err := load.New(gpu)                     // load.DefaultSettings; pins nothing yet
//	...
//	defer l.Close(ctx)
//	st, err := l.LoadFile(ctx, "model.bin", dst) // the whole file into dst
//	fmt.Printf("%.1f GB/s (%v)\n", st.GBps(), st.Mode)
//
// Load takes a list of Ranges (file offset, length, destination buffer or
// DeviceBuffer.Slice view) for files holding many tensors; package
// github.com/pinmem/pinmem/safetensors builds on it.
//
// # Direct I/O or the page cache
//
// A file that is in the page cache is read fastest by copying it from
// there (ModeBuffered). A cold file on NVMe is read fastest with O_DIRECT
// (ModeDirect): the drive writes straight into the pinned stage by DMA,
// no CPU copies the data, and the page cache is not filled with weights
// that live on the GPU from now on. ModeAuto, the default, samples the page
// cache with mincore(2) over up to 64 windows of 64 KiB spread over the
// ranges and reads buffered when at least half of the sampled pages are
// resident (WithWarmThreshold), directly otherwise. Direct reads use
// offsets and lengths rounded out to Align (4096) bytes, so a read may
// take up to 4 KiB more on either side of a range; the file's last
// partial block, when its size is not a multiple of Align, is read
// through the page cache (some kernels refuse a direct read at the
// unaligned end of a file). Where O_DIRECT is
// refused (tmpfs, FUSE, some network file systems: EINVAL or EOPNOTSUPP at
// open or at a read) the load falls back to buffered reads and
// Stats.Fallback says why; outside Linux every load is buffered.
//
// ModeMapped reads buffered and Stats.Fallback says so: copies out of
// read-only registered windows of the page cache were slower than
// buffered reads at every setting measured (10-20 against 33-48 GB/s on
// an H100 host).
//
// # Errors and cancellation
//
// Options are checked by New (a *pinmem.OptionError matching
// cuda.ErrInvalidValue); invalid ranges are a *RangeError (ErrRange) and a
// file shorter than the ranges a *ShortFileError (ErrShortFile), both
// before anything is read; only regular files are opened (a FIFO or a
// device is an error matching fs.ErrInvalid, and the open never blocks);
// a file that changes while it is loaded is an error matching ErrChanged.
// Loads on one Loader run one at a time; one that waits for its turn
// returns its context's error if the context ends first. Every wait of a
// load and of Close is bounded by its context, also on a device that
// never finishes a copy: a stage comes back to the Loader only once its
// copies have run, and the next load, Wait or Close waits for it (bounded
// by its own context). The destinations of a load that returned early
// may still be written by those copies: free them once Wait (or Close)
// has returned nil. A panic in a WithProgress or ready callback is recovered
// on the loader goroutine and raised again on the caller's. No error path
// leaves pinned memory behind: New releases what it created when it
// fails, and Close releases the rest (in the background, once the copies
// in flight finish, when its context ends first). A load that cannot pin
// a stage (a *pinmem.BudgetError over pinmem's budget, say) fails with
// that error like a failed read; the stages pinned before stay with the
// Loader until Close, and a later load pins the rest.
//
// # Why not transfer's staged ring
//
// transfer.Copier.HtoDFrom also reads into pinned stages while earlier
// ones are copied, through the Copier's ring: one stream, the stages
// taken in turn, each refilled once the copy out of it ran. A Loader keeps
// the same stage and the same reuse signal (a stage is refilled only once
// the event recorded behind its copies completed) but hands its stages out
// through a free channel rather than in turn: several goroutines read at
// once and finish in any order, each stage's copies run on one of several
// streams, and a direct read needs an aligned stage. load also sits below
// transfer (it needs no Copier), so the two paths stay apart.
//
// # Checkpoints of several files
//
// LoadFiles loads ranges of several files at once under the one pinned
// budget of the Loader's stages, calling back as each range lands;
// package safetensors uses it for sharded checkpoints.
package load
