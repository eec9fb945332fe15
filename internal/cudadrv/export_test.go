package cudadrv

// CCall exposes ccall to the package's external tests and benchmarks.
var CCall = ccall
