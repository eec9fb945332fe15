package cudadrv

import "time"

// CCall exposes ccall to the package's external tests and benchmarks.
func CCall(fn uintptr, args ...uintptr) uintptr { return ccall(fn, args...) }

// SetLoader replaces Load and the load wait for a test; the returned
// function puts them back.
func SetLoader(load func(string) (Driver, error), wait time.Duration) (restore func()) {
	mu.Lock()
	prevLoad, prevWait := loader, waitFor
	loader, waitFor = load, wait
	mu.Unlock()
	return func() {
		mu.Lock()
		loader, waitFor = prevLoad, prevWait
		mu.Unlock()
	}
}

// Auxv exposes the auxiliary-vector parser.
func Auxv(b []byte, key uint64) (uint64, bool) { return auxv(b, key) }

// SecureExec exposes secureExec.
func SecureExec() bool { return secureExec() }

// MissingSymbols returns the names of the symbols in SymbolNames that the
// real driver library d lacks (an older driver), or nil when every symbol
// resolved or d is not the real driver.
func MissingSymbols(d Driver) []string {
	l, ok := d.(*lib)
	if !ok || l == nil {
		return nil
	}
	var out []string
	for _, e := range l.s.table() {
		if *e.addr == 0 {
			out = append(out, e.name)
		}
	}
	return out
}

// ForceBatchCopyV1 makes the real binding d call the 12.8 form of the
// batch copy (cuMemcpyBatchAsync, with failIdx) even on a CUDA 13 driver
// that exports both, so the GPU suite checks that ABI too. It reports
// false, changing nothing, for a driver without that symbol or not the
// real binding; restore puts the choice made at Load back.
func ForceBatchCopyV1(d Driver) (restore func(), ok bool) {
	l, isLib := d.(*lib)
	if !isLib || l.s.memcpyBatchV1 == 0 {
		return func() {}, false
	}
	prev := l.batchV2
	l.batchV2 = false
	return func() { l.batchV2 = prev }, true
}
