// Package cudaerr gives the driver binding's failures package cuda's error
// types, for the packages above cuda that call the binding themselves
// (pinmem's host-memory calls, blocks' batch copies): each converts where
// it makes the call, so that errors.As finds a *cuda.Error (or
// *cuda.LoadError) in any error of pinmem. Package cuda converts its own
// calls the same way; it cannot import this package.
package cudaerr

import (
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
)

// Public returns err with a *cudadrv.Error replaced by the *cuda.Error and
// a *cudadrv.LoadError by the *cuda.LoadError with the same fields; any
// other error (nil included) is returned as it is.
func Public(err error) error {
	switch e := err.(type) {
	case *cudadrv.Error:
		return &cuda.Error{Op: e.Op, Code: cuda.Result(e.Code), Name: e.Name, Message: e.Detail}
	case *cudadrv.LoadError:
		return &cuda.LoadError{Path: e.Path, Symbol: e.Symbol, Err: e.Err}
	}
	return err
}

// Public2 is Public for a call that returns a value and an error.
func Public2[T any](v T, err error) (T, error) { return v, Public(err) }
