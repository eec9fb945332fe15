package sysinfo

import (
	"fmt"
	"strconv"
	"strings"
)

// System paths of the transparent huge page settings.
const (
	THPEnabledPath = "/sys/kernel/mm/transparent_hugepage/enabled"
	THPDefragPath  = "/sys/kernel/mm/transparent_hugepage/defrag"
	THPPMDSizePath = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"
)

// THP describes transparent huge pages. Huge pages matter for pinned memory:
// registering (cuMemHostRegister) a range backed by 2 MiB pages takes fewer
// page-table walks, and the kernel may split or collapse huge pages under
// memory that is about to be pinned.
type THP struct {
	// Enabled is the active mode of the enabled file: "always", "madvise"
	// or "never" (the bracketed word of "always [madvise] never").
	Enabled string
	// Defrag is the active mode of the defrag file ("always", "defer",
	// "defer+madvise", "madvise" or "never"); empty if it could not be read.
	Defrag string
	// PMDSize is the size of a PMD-mapped huge page in bytes (2 MiB on
	// x86-64); 0 if hpage_pmd_size could not be read.
	PMDSize uint64
}

// THP reads the transparent huge page settings. It fails if the enabled file
// cannot be read or parsed; a missing defrag or hpage_pmd_size file leaves
// that field empty, and the error for it is returned together with the
// partly filled result.
func (r Reader) THP() (*THP, error) {
	s, err := r.readString(THPEnabledPath)
	if err != nil {
		return nil, fmt.Errorf("sysinfo: reading transparent huge page mode: %w", err)
	}
	mode, err := bracketed(s)
	if err != nil {
		return nil, fmt.Errorf("sysinfo: %s: %w", r.path(THPEnabledPath), err)
	}
	t := &THP{Enabled: mode}
	var errs []error
	if s, err := r.readString(THPDefragPath); err != nil {
		errs = append(errs, fmt.Errorf("sysinfo: reading transparent huge page defrag mode: %w", err))
	} else if d, err := bracketed(s); err != nil {
		errs = append(errs, fmt.Errorf("sysinfo: %s: %w", r.path(THPDefragPath), err))
	} else {
		t.Defrag = d
	}
	if s, err := r.readString(THPPMDSizePath); err != nil {
		errs = append(errs, fmt.Errorf("sysinfo: reading huge page size: %w", err))
	} else if n, err := strconv.ParseUint(s, 10, 64); err != nil {
		errs = append(errs, fmt.Errorf("sysinfo: %s: huge page size %.64q is not a number: %w", r.path(THPPMDSizePath), s, ErrSyntax))
	} else {
		t.PMDSize = n
	}
	return t, joinErrs(errs)
}

// bracketed returns the word in brackets of a sysfs choice list such as
// "always [madvise] never".
func bracketed(s string) (string, error) {
	for _, w := range strings.Fields(s) {
		if len(w) > 2 && w[0] == '[' && w[len(w)-1] == ']' {
			return w[1 : len(w)-1], nil
		}
	}
	return "", fmt.Errorf("no [selected] mode in %.64q: %w", s, ErrSyntax)
}
