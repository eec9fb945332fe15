// Package cudatest runs code that uses pinmem on a machine without a GPU,
// in the spirit of net/http/httptest: a test installs a fake CUDA driver,
// written in plain Go, in place of libcuda, and everything built on pinmem
// (pinmem.Alloc, pool, transfer.Copier and Pipeline, package cuda) runs
// against it for the duration of the test.
//
//	func TestUpload(t *testing.T) {
//		d := cudatest.Install(t)
//		// ... code that uses pinmem, cuda and transfer ...
//		d.FailOn(cudatest.AnyHtoD, cudatest.Once(), cuda.ResultLaunchFailed)
//		// ... check that the failure surfaces as cuda.ErrLaunchFailed ...
//	} // the cleanup fails t if a stream, event, allocation or registration is left
//
// The fake models what the code above it can observe: devices with
// configurable names, memory and attributes; pinned host memory that is real
// memory (an anonymous mapping) and registered ranges tracked as the driver
// tracks them; device memory backed by Go memory, so copies and memsets
// move real bytes and a round trip can be checked byte for byte; streams
// and events that run queued work in order, with the legacy default
// stream's implicit synchronization; and a current context per OS thread,
// as in CUDA. Calls that need a current context fail with
// CUDA_ERROR_INVALID_CONTEXT (matching cuda.ErrInvalidHandle) when the
// calling thread has none, so code that calls the driver from a goroutine
// that did not enter a context fails here too.
//
// Where the driver is stricter than a simple model would be, the fake
// copies it, so that code which relies on the kinder model fails here as
// it fails on a GPU. Small pinned allocations (cuMemHostAlloc of up to 256
// KiB) come back as the driver returns them, 512 bytes apart in pages they
// share with other small allocations, so memory is never pinned in whole
// pages of its own. Registering memory with a byte that is pinned already
// fails with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (matching
// cuda.ErrAlreadyRegistered); memory that only shares a page with a
// registered range is registered, as on the driver. One copy may not
// span two registrations, or run from one allocation into its neighbour
// (CUDA_ERROR_INVALID_VALUE). Asynchronous work that touches memory freed
// or unregistered before it ran fails with CUDA_ERROR_ILLEGAL_ADDRESS, and
// as on a GPU that fault is sticky: it breaks the context, and every later
// call in it reports the fault again, cuStreamQuery of any of its streams
// included. Calls that release objects still work (on a GPU they may not),
// so that a test can clean up; ClearFaults repairs the context.
//
// A test can make driver calls fail (FailOn, FailAsync), chosen by driver
// function or by operation class (AnyHtoD, AnyDtoH, AnyLaunch, AnyAlloc:
// every path a size or an option takes), once, on the nth call or always,
// and sticky (When.Sticky: every later call in the context fails, as after
// CUDA_ERROR_ILLEGAL_ADDRESS on a GPU). An injected asynchronous fault that
// is not sticky is reported once, by the first query or synchronization
// that observes it: a convenience for testing recovery paths, where a GPU
// would report CUDA_ERROR_ILLEGAL_ADDRESS or a launch failure every time. It can hold streams so that queued
// work waits, as on a busy or hung GPU (HoldStream, with the streams of
// code under test from Streams; HoldAll), wait until the code under test
// is blocked on held work (WaitBlocked) instead of sleeping, count calls
// (Calls), give a kernel a Go body (RegisterKernel), and check that every
// object it created was released (Leaks; Install checks at
// cleanup). The errors the fake makes name cudatest and say what it
// injected or refused.
//
// What it does not do: it has no timing model (copies take no time to
// speak of), runs no device code (a kernel is the Go function registered
// for its name), and says nothing about how fast, or even whether, the code
// works on a GPU. A test that passes here proves the
// logic and the error paths of the code above the driver, never a GPU
// result; run the same tests on a machine with a GPU for that.
//
// The fake is process-wide, like the driver it replaces: tests that install
// one must not run in parallel with each other (a second Install while one
// is active fails the test, unless it comes from the same test or one of its
// subtests, which nest).
package cudatest
