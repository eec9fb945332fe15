// Package lifecycle is the one life of pinmem's owners of driver
// resources (a transfer.Copier, Pipeline or Multi, a pool.Pool, blocks'
// kernels, a load.Loader, a pinmem.Buffer):
//
//   - Gate counts the calls in progress and says when a closed owner is
//     idle;
//   - Releaser makes a release retryable until the driver lets go of
//     everything, and Drop frees one object so that a failed free is
//     retried by the next pass;
//   - Orphan keeps what a failed release left, in one process-wide
//     registry that every constructor retries (RetryOrphans), so that a
//     caller retrying once the driver works again leaves nothing behind;
//     Keep holds what can never be released (memory a dropped Buffer
//     still pins) reachable;
//   - Close is an owner's Close bounded by a context: it waits for the
//     gate's idle and the release, which go on in the background when the
//     context ends first; Dropped is the cleanup of an owner dropped
//     without Close.
//
// Every owner's ErrClosed matches cuda.ErrClosed (see Closed).
package lifecycle
