// Package enumtext parses the names of pinmem's enums (pinmem.Flags and
// Method, load.Mode, transfer.WaitMode, blocks.Strategy) one way.
package enumtext

import "strings"

// Index returns the index in names of name, compared without regard to
// case and surrounding spaces, or -1.
func Index(names []string, name string) int {
	n := strings.TrimSpace(name)
	for i, k := range names {
		if strings.EqualFold(n, k) {
			return i
		}
	}
	return -1
}
