// Package cuda is the safe Go face of the NVIDIA driver API that pinmem
// builds on: devices and their properties, primary contexts, streams,
// events, device memory with synchronous and asynchronous copies, and
// modules with kernel launch.
//
// Every call that needs a context runs on a goroutine locked to its OS
// thread with the right context current, so callers never manage thread
// affinity themselves. Every object exposes its raw driver handle, and
// objects created by other code (TensorRT, ONNX Runtime, cgo) can be
// wrapped as borrowed: pinmem uses them and never frees them.
//
// Pinning host memory is deliberately absent here: it belongs to the
// pinmem package, which accounts for every pinned byte.
//
// A failed driver call is an *Error (get it with errors.As) carrying the
// driver function, the CUresult and the driver's own name and text; every
// error matches the sentinels (ErrOutOfMemory ...) through errors.Is.
// Success is always a nil error. Methods on nil objects and nil arguments
// return an error matching ErrInvalidValue; they never panic.
package cuda
