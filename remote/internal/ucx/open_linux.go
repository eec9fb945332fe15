//go:build linux

package ucx

import (
	"errors"
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"
)

// dlopen loads the library on a locked thread (dlerror is per thread).
func dlopen(path string) (uintptr, error) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		return 0, errors.New("no UCX binding for 32-bit platforms (the structure layouts are those of LP64)")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

func dlsym(h uintptr, name string) (uintptr, error) { return purego.Dlsym(h, name) }
