package sysinfo

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Errors of malformed files match one of these (errors.Is), besides naming
// the path and the value.
var (
	// ErrSyntax: the text is not in the file's format.
	ErrSyntax = errors.New("sysinfo: malformed value")
	// ErrRange: a number is outside what the file can hold (a CPU number
	// above MaxCPUIndex, a kB figure whose bytes overflow 64 bits, ...).
	ErrRange = errors.New("sysinfo: value out of range")
)

// Reader reads system facts from the files under Root. The zero value reads
// the live system ("/"); tests point Root at a fixture tree laid out like the
// real one (Root/proc/meminfo, Root/sys/fs/cgroup/..., and so on).
//
// Facts that do not come from files (RLIMIT_MEMLOCK, runtime.NumCPU) always
// describe the calling process, whatever Root is.
type Reader struct {
	// Root is the directory that stands for "/". Empty means "/".
	Root string
}

// path returns the on-disk path of the absolute system path p.
func (r Reader) path(p string) string {
	root := r.Root
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, p)
}

// readFile reads the system file p (an absolute path such as "/proc/meminfo").
// Errors from os already name the full path and wrap fs.ErrNotExist and friends.
func (r Reader) readFile(p string) ([]byte, error) {
	return os.ReadFile(r.path(p))
}

// readString reads the system file p and trims surrounding white space.
func (r Reader) readString(p string) (string, error) {
	b, err := r.readFile(p)
	if err != nil {
		return "", err
	}
	return string(bytes.TrimSpace(b)), nil
}

// Limit is a byte limit that may be unlimited. It is a plain byte count
// except for the value [Unlimited], so the tighter of two limits is simply
// the smaller one.
type Limit uint64

// Unlimited is the [Limit] that means no limit at all (RLIM_INFINITY,
// cgroup v2 "max", or a cgroup v1 value too large to be a real limit).
const Unlimited Limit = math.MaxUint64

// IsUnlimited reports whether l is [Unlimited].
func (l Limit) IsUnlimited() bool { return l == Unlimited }

// String returns "unlimited" or the byte count in decimal.
func (l Limit) String() string {
	if l.IsUnlimited() {
		return "unlimited"
	}
	return strconv.FormatUint(uint64(l), 10)
}

// parseKeyValueFile parses files made of "Key: value [kB]" lines, such as
// /proc/meminfo, /proc/self/status and /sys/devices/system/node/nodeN/meminfo
// (whose "Node N " prefix is dropped). Values with a kB unit are converted to
// bytes; values without a unit (HugePages_Total, ...) are kept as they are.
// Lines whose value is not a single number, with or without kB (status's
// Name, State, Uid, ...), are skipped.
func parseKeyValueFile(path string, data []byte) (map[string]uint64, error) {
	out := make(map[string]uint64)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "Node ") {
			// "Node 0 MemTotal:  123 kB"
			f := strings.SplitN(line, " ", 3)
			if len(f) == 3 {
				line = f[2]
			}
		}
		key, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		key = strings.TrimSpace(key)
		fields := strings.Fields(rest)
		if key == "" || len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			continue // not a numeric field (Name:, State:, Cpus_allowed_list:, ...)
		}
		switch {
		case len(fields) == 2 && fields[1] == "kB":
			if v > math.MaxUint64/1024 {
				return nil, fmt.Errorf("sysinfo: %s: %s value %s kB overflows uint64 bytes: %w", path, key, fields[0], ErrRange)
			}
			v *= 1024
		case len(fields) != 1:
			continue // several values (Uid:, Gid:) or an unknown unit
		}
		out[key] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("sysinfo: reading %s: %w: %w", path, ErrSyntax, err)
	}
	return out, nil
}
