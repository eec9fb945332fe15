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
// The driver library is loaded on first use: libcuda.so.1 through the
// dynamic loader's search path, or the file that the environment variable
// PINMEM_LIBCUDA names. That must be a regular file (anything else is
// refused with a *LoadError), and the variable is ignored in a setuid,
// setgid or otherwise privileged process (the kernel's AT_SECURE). A load
// that does not finish (a broken driver whose cuInit never returns) makes
// callers wait at most two minutes for an error matching ErrNoDriver.
//
// Pinning host memory is deliberately absent here: it belongs to the
// pinmem package, which accounts for every pinned byte.
//
// Device memory is a DeviceBuffer. Its synchronous copies are ReadAt and
// WriteAt (io.ReaderAt and io.WriterAt); the stream-ordered ones
// (Stream.CopyHtoD, CopyDtoH, CopyDtoD, Memset) take a DeviceBuffer and an
// offset, and every copy checks that the buffer is live and the range lies
// inside it before any driver call: a freed buffer (or a view of one) is
// refused with ErrInvalidHandle, a range outside it with ErrInvalidValue.
//
// Every wait takes a context.Context that bounds it (Stream.Synchronize,
// Event.Synchronize, Context.Synchronize): when ctx ends first, the call
// returns ctx.Err() and the queued work may still be running. The driver's
// synchronous copies (ReadAt, WriteAt, DeviceBuffer.Memset) cannot be
// interrupted and are not bounded; their bounded form is the stream copy
// followed by Stream.Synchronize(ctx).
//
// A failed driver call is an *Error (get it with errors.As) carrying the
// driver function, the CUresult and the driver's own name and text; every
// error matches the sentinels (ErrOutOfMemory ...) through errors.Is.
// Success is always a nil error. Methods on nil objects and nil arguments
// return an error matching ErrInvalidValue; they never panic.
package cuda
