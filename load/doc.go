// Package load reads files, or byte ranges of them, into GPU device memory
// as fast as the disk, the page cache and the PCIe link allow: the way an
// inference server loads many gigabytes of model weights at start-up.
//
// A Loader holds a fixed set of pinned stages (pinmem.Alloc, charged to
// pinmem's budget, so its pinned memory is bounded and accounted) and a few
// CUDA streams. A load splits the ranges into reads of at most one stage;
// several goroutines pread in parallel into free stages, and each filled
// stage is drained by asynchronous host-to-device copies (cuda.Stream.
// CopyHtoD) while the readers fill others. A stage is refilled only after
// the event recorded behind its copies has completed.
//
//	l, err := load.New(gpu)                     // 16 stages of 16 MiB
//	...
//	defer l.Close()
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
// cache with mincore(2) over up to 64 windows of 1 MiB spread over the
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
// # Errors and cancellation
//
// Options are checked by New (an *OptionError matching
// cuda.ErrInvalidValue); invalid ranges are a *RangeError (ErrRange) and a
// file shorter than the ranges a *ShortFileError (ErrShortFile), both
// before anything is read. Loads on one Loader run one at a time; one that
// waits for its turn returns its context's error if the context ends
// first. A canceled context stops new reads at once;
// Load then waits for the copies already queued, at most the stages'
// memory, because a stage cannot be reused or freed while the copy engine
// still reads it. No error path leaves pinned memory behind: New releases
// what it created when it fails, and Close releases the rest.
package load
