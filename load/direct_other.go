//go:build !linux

package load

import (
	"errors"
	"os"
)

// errNoDirect is why ModeDirect reads buffered outside Linux.
var errNoDirect = errors.New("O_DIRECT is supported on Linux only")

func openDirect(*os.File) (*os.File, error) { return nil, errNoDirect }

func isDirectRefusal(err error) bool { return errors.Is(err, errNoDirect) }

// residency cannot be sampled outside Linux.
func residency(*os.File, []extent) (float64, bool) { return 0, false }
