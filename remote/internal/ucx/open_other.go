//go:build !linux

package ucx

import "errors"

func dlopen(string) (uintptr, error) {
	return 0, errors.New("no UCX binding for this platform (64-bit Linux only)")
}

func dlsym(uintptr, string) (uintptr, error) { return 0, errors.New("unreachable") }
