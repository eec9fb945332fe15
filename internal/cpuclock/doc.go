// Package cpuclock reads CPU time: the calling thread's, where the system
// measures it (getrusage(RUSAGE_THREAD) on Linux), and the whole
// process's, for the CPU cost figures of transfers and benchmarks.
package cpuclock
