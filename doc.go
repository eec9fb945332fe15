// Package pinmem allocates, registers, budgets and accounts for page-locked
// ("pinned") host memory for NVIDIA GPUs.
//
// Pinned memory is what lets the GPU's copy engines move data by DMA,
// without the driver's own copy through a staging buffer that pageable
// memory takes; it lets copies run asynchronously and overlap kernels,
// and, when mapped, lets kernels read and write host memory directly
// (zero-copy). The repository's README and docs/PERF.md give the rates
// measured for each kind of memory with their ratio to pageable memory in
// the same run, and name the device and commit; pinmem bench measures
// them on your machine.
//
// # Getting pinned memory
//
// [Alloc] returns a [Buffer] of pinned memory with any combination of the
// cudaHostAlloc flags ([Portable], [Mapped], [WriteCombined]). Small buffers
// come from cuMemHostAlloc; large ones (MethodAuto, at least
// [AutoMmapThreshold]) are mapped by pinmem itself with mmap, backed by
// transparent huge pages where the kernel offers them, faulted in by
// several goroutines in parallel, and then page-locked with
// cuMemHostRegister in bounded chunks, which pins and releases gigabytes in
// less time than cuMemHostAlloc (the README and docs/PERF.md give the
// measured ratio; pinmem bench pin measures it here). [Register] pins a
// Go slice in place (it is kept alive and unmovable with runtime.Pinner
// while registered).
//
// Every buffer must be released with [Buffer.Free]; a Free that failed (the
// driver refused to release the memory) leaves the buffer counted as
// pinned and may be retried. A buffer that becomes unreachable without
// Free is counted in [LedgerStats].Dropped and reported through the logger
// set with [SetLogger] (silent by default), but never freed behind the
// caller's back: its memory may still be in use by the GPU.
//
// # Releasing what you made
//
// Every package of pinmem names a release by what it releases, with one of
// three verbs:
//
//   - Free releases memory and returns at once: [Buffer.Free],
//     cuda.DeviceBuffer.Free, safetensors.Tensors.Free. No copy or kernel
//     queued on the memory may still run: wait for it first.
//   - Destroy releases one driver handle, as the driver's own call does
//     (cuStreamDestroy ...): cuda.Context, cuda.Stream, cuda.Event and
//     cuda.Module. Work already queued still completes.
//   - Close(ctx) stops something that owns goroutines or streams
//     (transfer.Copier, transfer.Pipeline, transfer.Multi, load.Loader,
//     pool.Pool, blocks.Copier): it waits, bounded by ctx, for the copies
//     it queued, then releases everything it holds; when ctx ends first it
//     returns ctx's error, and what is left is released once those copies
//     have run, in the background or by a later Close (each Close says
//     which).
//
// cudatest.Driver.Close takes no context: it uninstalls the fake driver
// and waits for nothing. transfer.Copier.Forget is not a release of the
// Copier: it drops the registration cache's hold on one slice.
//
// # Segments: one copy must not span two registrations
//
// cuMemHostRegister pins at most 4 GiB per call in pinmem (one call pinning
// hundreds of GB stalls other processes' CUDA calls; where a kernel caps a
// single pin at 2 GB, a refused 4 GiB chunk is retried as 1 GiB pieces). A
// registered buffer up to 4 GiB is therefore one registration (unless the
// kernel caps a single pin); a larger one is several, and the driver treats each as its own pinned range: an
// asynchronous copy whose host range crosses from one registration into the
// next fails (CUDA_ERROR_INVALID_VALUE, matching [cuda.ErrInvalidValue],
// with driver 580). [Buffer.Segments] returns the registered ranges in
// order; copy a large buffer one segment at a time. cuMemHostAlloc buffers
// are always one segment.
//
// # The budget
//
// Pinned memory cannot be swapped or reclaimed; pinning too much starves
// the rest of the system, and inside a container the cgroup's OOM killer
// ends the process rather than failing an allocation. pinmem therefore
// keeps every process under a budget: by default half of the physical
// memory it may use (the smaller of MemTotal and the cgroup memory limit),
// settable with the PINMEM_BUDGET environment variable (bytes with an
// optional K, M, G, T, Ki, Mi, Gi or Ti suffix, or a percentage of physical
// memory such as "40%") and with [SetBudget]. A request that would exceed it
// first asks pinmem's caches of pinned memory (the idle blocks of every
// pool.Pool, the registration caches of transfer's Copiers) to give idle
// memory back and then fails, before the driver is called, with a
// [*BudgetError] saying how much was asked, how much is pinned and what the
// limit is.
//
// # The ledger
//
// /proc/meminfo's Mlocked (and the process's VmLck and VmPin) do not show
// CUDA pinned memory at all: the NVIDIA driver pins pages through its own
// kernel module, not through mlock(2). Memory from cuMemHostAlloc shows up
// as Shmem/RssShmem, and registered memory shows up nowhere except as a
// lower MemAvailable. So pinmem keeps an exact ledger of what it pinned:
// [Stats] returns it.
// Importing pinmem publishes nothing: package
// github.com/pinmem/pinmem/expvars publishes the ledger with expvar on
// request, and package github.com/pinmem/pinmem/prom exports it to
// Prometheus.
//
// # Devices
//
// Every driver call runs on a goroutine locked to its OS thread with the
// device's primary context current. On integrated GPUs (Jetson, Tegra),
// which share physical memory with the host, MethodAuto prefers mapped
// cuMemHostAlloc memory; devices that cannot register host memory refuse
// Register and MethodMmapRegister with an error matching [cuda.ErrNotSupported].
package pinmem
