//go:build !unix

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "gpusuite runs the GPU suite on Linux only")
	os.Exit(2)
}
