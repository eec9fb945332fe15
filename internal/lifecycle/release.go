package lifecycle

import (
	"errors"
	"sync"
)

// Drop releases *p with rel and clears it when that succeeded or failed
// with gone (the object is gone already: freed before, or with its
// destroyed context), else counts it in left; it returns rel's error.
// Calling it again retries a failed release.
func Drop[T any](p **T, left *int, rel func(*T) error, gone error) error {
	if *p == nil {
		return nil
	}
	err := rel(*p)
	if err == nil || errors.Is(err, gone) {
		*p = nil
		return err
	}
	*left++
	return err
}

// Releaser makes an owner's release retryable: each Release runs step,
// under a lock, until a pass leaves nothing held.
type Releaser struct {
	mu   sync.Mutex
	done bool
	step func() (left int, err error) // left: the objects the driver still holds
}

// NewReleaser returns a Releaser whose passes run step.
func NewReleaser(step func() (left int, err error)) *Releaser {
	return &Releaser{step: step}
}

// Release runs step unless an earlier pass released everything.
func (r *Releaser) Release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return nil
	}
	left, err := r.step()
	r.done = left == 0
	return err
}

// Released reports whether a pass released everything.
func (r *Releaser) Released() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// Orphan keeps r for RetryOrphans unless a pass released everything.
func (r *Releaser) Orphan() {
	if r.Released() {
		return
	}
	Orphan(func() bool {
		_ = r.Release()
		return r.Released()
	})
}

// orphans is pinmem's one registry of what failed releases left: retry
// (the releases RetryOrphans retries, each reporting whether it released
// everything) and kept (what stays reachable for the life of the process).
var orphans struct {
	sync.Mutex
	retry []func() bool
	kept  []any
}

// Orphan keeps retry, a release that failed to release everything, for
// RetryOrphans, which every owner's constructor (and Close) calls.
func Orphan(retry func() (released bool)) {
	orphans.Lock()
	orphans.retry = append(orphans.retry, retry)
	orphans.Unlock()
}

// Keep keeps v reachable for the life of the process: what the driver
// still holds and nothing may release (a Buffer dropped without Free, a
// pin whose undoing failed), with a Go slice's runtime.Pinner that must
// not become unreachable while it pins.
func Keep(v any) {
	orphans.Lock()
	orphans.kept = append(orphans.kept, v)
	orphans.Unlock()
}

// RetryOrphans retries every orphan's release, keeping those still held.
func RetryOrphans() {
	orphans.Lock()
	retry := orphans.retry
	orphans.retry = nil
	orphans.Unlock()
	for _, r := range retry {
		if !r() {
			Orphan(r)
		}
	}
}

// Orphans returns the number of releases waiting for RetryOrphans and of
// values kept by Keep.
func Orphans() (retry, kept int) {
	orphans.Lock()
	defer orphans.Unlock()
	return len(orphans.retry), len(orphans.kept)
}

// TakeKept returns the values Keep kept and forgets them, for a test
// that releases what dropped buffers still pin.
func TakeKept() []any {
	orphans.Lock()
	defer orphans.Unlock()
	kept := orphans.kept
	orphans.kept = nil
	return kept
}
