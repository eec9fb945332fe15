// Package sysinfo reads the Linux facts that matter for page-locked (pinned)
// host memory: memory totals from /proc/meminfo, the process's own memory
// from /proc/self/status, RLIMIT_MEMLOCK, the cgroup memory limit, transparent
// huge pages, the PCIe link of each GPU and the NUMA layout.
//
// Every figure is read from the real files through a [Reader] whose Root
// (default "/") can point at a fixture tree in tests. A file that is missing
// or malformed never panics: the figure is reported as unknown (a nil pointer
// or a false Known flag) and the error, naming the path and the bad value, is
// returned or, for [Reader.Snapshot], listed in [Info.Errors].
//
// # Where CUDA pinned memory shows up (and where it does not)
//
// With the NVIDIA driver (580, on Linux 6.18): after cuMemHostAlloc of 2 GiB,
// /proc/meminfo's Shmem and the process's RssShmem each grow by 2 GiB, while
// Mlocked, Unevictable, VmLck and VmPin do not change at all. The driver pins
// pages through its own kernel module, not through mlock(2), so the kernel's
// "locked" counters never see them and RLIMIT_MEMLOCK does not bound them.
// After cuMemHostRegister of 2 GiB of ordinary anonymous memory none of those
// counters change either; the only host figure that moves is MemAvailable,
// which drops because the pages are resident and can no longer be reclaimed
// or swapped.
//
// So Mlocked and VmLck are the wrong place to ask "how much is pinned": a
// library that needs that number must keep its own ledger. What this package
// offers instead is the budget base ([Reader.PhysicalMemory], the smaller of
// MemTotal and the cgroup limit; pinmem's default budget is half of it) and
// the figures that do move (Shmem, RssShmem, MemAvailable) for cross-checks.
package sysinfo
