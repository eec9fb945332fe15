package cudadrv

// CCall exposes ccall to the package's external tests and benchmarks.
func CCall(fn uintptr, args ...uintptr) uintptr { return ccall(fn, args...) }
