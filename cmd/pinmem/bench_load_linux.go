//go:build linux

package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// openDirectFile opens path read-only with O_DIRECT.
func openDirectFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
}

// dropPageCache writes dirty pages back and drops the page cache, dentries
// and inodes (echo 3 > /proc/sys/vm/drop_caches); it needs root.
func dropPageCache() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}
