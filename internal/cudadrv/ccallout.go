package cudadrv

// ccallOut is ccall for calls whose arguments include the address of a Go
// variable (an out-parameter). Such a variable may live on the goroutine's
// stack, and the stack may be copied elsewhere while the call is on its way
// into C (when a function on the way grows it); the C side would then write
// to the old copy. //go:uintptrescapes moves every variable whose address is
// converted to uintptr in the call's arguments to the heap, which does not
// move. Calls without out-parameters use ccall and allocate nothing.
//
//go:uintptrescapes
//go:noinline
func ccallOut(fn uintptr, args ...uintptr) uintptr { return ccall(fn, args...) }
