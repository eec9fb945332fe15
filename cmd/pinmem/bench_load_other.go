//go:build !linux

package main

import (
	"errors"
	"os"
)

var errLinuxOnly = errors.New("supported on Linux only")

func openDirectFile(string) (*os.File, error) { return nil, errLinuxOnly }

func dropPageCache() error { return errLinuxOnly }
