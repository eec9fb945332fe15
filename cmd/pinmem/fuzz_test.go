package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/tools/bench"
)

// FuzzFlagLists: the command's own list flags (--devices, --reuse) parse
// to values in range without an error only, and their joined form parses
// back to the same list; a valid --reuse list is a valid ZeroCopyConfig.
// It runs as a test on its seeds; .ci/run also fuzzes it for a bounded time.
func FuzzFlagLists(f *testing.F) {
	for _, s := range []string{"all", "", "0", "1, 0,1", "0,x", "-1", "1,2,4,8", "1,0", "1001", " , ", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if devs, err := parseDevices(s); err == nil {
			var parts []string
			for i, d := range devs {
				if d < 0 || slices.Contains(devs[:i], d) {
					t.Fatalf("parseDevices(%q) = %v", s, devs)
				}
				parts = append(parts, strconv.Itoa(d))
			}
			if devs != nil {
				if back, err := parseDevices(strings.Join(parts, ",")); err != nil || !slices.Equal(back, devs) {
					t.Fatalf("parseDevices(%q) = %v; joined back %v, %v", s, devs, back, err)
				}
			}
		}
		if reuse, err := parseReuse(s); err == nil {
			var parts []string
			for _, r := range reuse {
				if r < 1 || r > bench.MaxReuse {
					t.Fatalf("parseReuse(%q) = %v", s, reuse)
				}
				parts = append(parts, strconv.Itoa(r))
			}
			if back, err := parseReuse(strings.Join(parts, ",")); err != nil || !slices.Equal(back, reuse) {
				t.Fatalf("parseReuse(%q) = %v; joined back %v, %v", s, reuse, back, err)
			}
			if err := (bench.ZeroCopyConfig{Reuse: reuse}).Validate(); err != nil {
				t.Fatalf("parseReuse(%q) = %v, which ZeroCopyConfig refuses: %v", s, reuse, err)
			}
		}
	})
}

// FuzzReportCommand: `pinmem report` on any file content either renders
// it (status 0) or refuses it with one line on stderr and the usage status
// 2, never a panic or another status.
func FuzzReportCommand(f *testing.F) {
	if b, err := os.ReadFile(fixture("bw.json")); err == nil {
		f.Add(b)
	}
	for _, s := range []string{"", "{", "not json", `{"meta":{"schema_version":1},"results":[]}`, `{"meta":{"schema_version":2},"results":[]}`} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "in.json")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		code := execute(context.Background(), []string{"report", p, "--format", "csv"}, &out, &errb)
		switch code {
		case exitOK:
		case exitUsage:
			if strings.Count(errb.String(), "\n") != 1 {
				t.Fatalf("stderr is not one line: %q", errb.String())
			}
		default:
			t.Fatalf("exit status %d: %s", code, errb.String())
		}
	})
}
