// Package pinopt lets pinmem's other packages check a list of pinmem
// options when they are given, as pinmem.Alloc checks them later, so that a
// constructor taking pinmem options (pool.New) refuses bad ones at once.
package pinopt

// Check, installed by package pinmem, returns the error pinmem.Alloc would
// return for opts, a []pinmem.Option, before it pins anything (an option
// that is nil, or one whose value Alloc refuses), or nil.
var Check func(opts any) error
