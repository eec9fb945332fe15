package pinmem

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pinmem/pinmem/cuda"
)

// Errors of this package, matched with errors.Is.
var (
	// ErrBudget: the request would take the pinned total over the budget.
	// The error is a *BudgetError with the figures.
	ErrBudget = errors.New("pinmem: pinned memory budget exceeded")
	// ErrFreed: the buffer was already freed.
	ErrFreed = errors.New("pinmem: buffer already freed")
	// ErrNotMapped: the buffer is not mapped into the device address space
	// (it was not allocated or registered with Mapped).
	ErrNotMapped = errors.New("pinmem: buffer not mapped into the device address space")
)

// NameError is returned by UnmarshalText of the enums a user sets from
// flags or configuration (pinmem.Flags and Method, load.Mode,
// transfer.WaitMode, blocks.Strategy) for a name they do not know. It
// matches cuda.ErrInvalidValue. Every package of pinmem uses this one type.
type NameError struct {
	Type  string   // the type, e.g. "pinmem.Method"
	Name  string   // the name refused, as given
	Known []string // the names the type takes
}

// Error names the type, the name and the names it takes.
func (e *NameError) Error() string {
	if e == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s: unknown name %q (want one of %s)", e.Type, e.Name, strings.Join(e.Known, ", "))
}

// Is matches cuda.ErrInvalidValue.
func (e *NameError) Is(target error) bool {
	return e != nil && target == cuda.ErrInvalidValue
}

// OptionError is returned for an option that a function taking options
// (Alloc, Register, pool.New, blocks.New, load.New, transfer.New ...)
// refuses, or a nil option. It matches cuda.ErrInvalidValue. Every package
// of pinmem uses this one type. A function that checks options meant for
// another (pool.New those of pool.WithFlags, which pinmem.Alloc takes)
// refuses them as that one would, under its own Func, with Option
// qualified ("pinmem.WithThreads").
type OptionError struct {
	Func   string // the function, e.g. "pool.New" or "pinmem.Alloc"
	Option string // the option's name, e.g. "WithPrewarm"
	Value  string // its arguments as given, e.g. "0, 1"
	Reason string // why they were refused
}

// Error names the constructor, the option, its arguments and the reason.
func (e *OptionError) Error() string {
	if e == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s: %s(%s): %s", e.Func, e.Option, e.Value, e.Reason)
}

// Is matches cuda.ErrInvalidValue.
func (e *OptionError) Is(target error) bool {
	return e != nil && target == cuda.ErrInvalidValue
}

// BudgetError is returned when a request would take the pinned total over
// the budget (after the reclaimers were asked for memory). It matches
// ErrBudget.
type BudgetError struct {
	Requested int64 // bytes asked for
	Pinned    int64 // bytes pinned (or being pinned) by pinmem when the request failed
	Limit     int64 // the budget
}

// Error describes the failure with its figures.
func (e *BudgetError) Error() string {
	if e == nil {
		return "<nil>"
	}
	return fmt.Sprintf("pinmem: pinning %s would exceed the budget: %s already pinned, limit %s (set PINMEM_BUDGET or pinmem.SetBudget)",
		fmtBytes(e.Requested), fmtBytes(e.Pinned), fmtBytes(e.Limit))
}

// Is reports whether target is ErrBudget.
func (e *BudgetError) Is(target error) bool {
	if e == nil {
		return false
	}
	return target == ErrBudget
}

// OutOfMemoryError is returned when the driver or the host failed to
// provide pinned memory that was within the budget (the driver's
// CUDA_ERROR_OUT_OF_MEMORY, mmap's ENOMEM, a container limit). It matches
// cuda.ErrOutOfMemory and carries the same figures as a BudgetError; Err is the
// underlying error.
type OutOfMemoryError struct {
	Op        string // what failed, e.g. "cuMemHostAlloc" or "mmap"
	Requested int64  // bytes asked for
	Pinned    int64  // bytes pinned by pinmem before this request
	Limit     int64  // the budget
	Err       error  // the driver's or the system's error
}

// Error describes the failure with its figures.
func (e *OutOfMemoryError) Error() string {
	if e == nil {
		return "<nil>"
	}
	return fmt.Sprintf("pinmem: %s of %s failed with %s already pinned (budget %s): %v",
		e.Op, fmtBytes(e.Requested), fmtBytes(e.Pinned), fmtBytes(e.Limit), e.Err)
}

// Is reports whether target is cuda.ErrOutOfMemory.
func (e *OutOfMemoryError) Is(target error) bool {
	if e == nil {
		return false
	}
	return target == cuda.ErrOutOfMemory
}

// Unwrap returns the underlying error.
func (e *OutOfMemoryError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// fmtBytes formats n bytes as "N bytes (X.Y GiB)".
func fmtBytes(n int64) string {
	const (
		ki = 1 << 10
		mi = 1 << 20
		gi = 1 << 30
	)
	switch {
	case n >= gi || n <= -gi:
		return fmt.Sprintf("%d bytes (%.2f GiB)", n, float64(n)/gi)
	case n >= mi || n <= -mi:
		return fmt.Sprintf("%d bytes (%.2f MiB)", n, float64(n)/mi)
	case n >= ki || n <= -ki:
		return fmt.Sprintf("%d bytes (%.2f KiB)", n, float64(n)/ki)
	}
	return fmt.Sprintf("%d bytes", n)
}
