package sysinfo

// Rlimit is a resource limit of the calling process.
type Rlimit struct {
	// Soft is the limit the kernel enforces now.
	Soft Limit
	// Hard is the ceiling an unprivileged process may raise Soft to.
	Hard Limit
}

// MemlockLimit returns the calling process's RLIMIT_MEMLOCK, the cap on
// mlock(2)ed memory. CUDA pinned memory is not charged to it (the driver pins
// without mlock), so it does not bound cuMemHostAlloc or cuMemHostRegister;
// it is reported because it bounds anything that does use mlock. It always
// describes the live process, whatever the Reader's Root.
func (r Reader) MemlockLimit() (Rlimit, error) {
	return getMemlock()
}
