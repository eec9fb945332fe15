package bench

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The fuzz targets run as ordinary tests on their seeds; .ci/run also runs
// each with -fuzz for a bounded time.

// FuzzParseSize: a size parses to 1..MaxSize or fails with ErrInvalid;
// FormatSize of the result parses back to it; a plain decimal number
// parses to itself.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"64KiB", "64k", "1.5GiB", " 4g ", "1000", "1MB", "1.005KB", "1TiB", "0", "-1", "12Q", "1EiB",
		"0.1KiB", "2TiB", "KiB", "1..2M", ".5K", "99999999999999999999", "1e3", "0x10", "١٢", "1\x00K"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseSize(%q): error %v does not match ErrInvalid", s, err)
			}
			return
		}
		if n < 1 || n > MaxSize {
			t.Fatalf("ParseSize(%q) = %d, outside 1..MaxSize", s, n)
		}
		if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
			t.Fatalf("ParseSize(%q) = %d, but FormatSize gives %q, which parses to %d, %v", s, n, FormatSize(n), back, err)
		}
		if v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil && v != n {
			t.Fatalf("ParseSize(%q) = %d, want %d", s, n, v)
		}
	})
}

// FuzzFormatSize: every size in range formats to a string that parses
// back to it.
func FuzzFormatSize(f *testing.F) {
	for _, n := range []int64{1, 1000, 1023, 1024, 1536, 3 << 29, 1<<40 - 1, 1 << 40, 123456789} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n int64) {
		if n < 1 || n > MaxSize {
			n = 1 + (n%MaxSize+MaxSize)%MaxSize
		}
		s := FormatSize(n)
		if back, err := ParseSize(s); err != nil || back != n {
			t.Fatalf("FormatSize(%d) = %q, which parses to %d, %v", n, s, back, err)
		}
	})
}

// FuzzParseLists: kind, direction, method, size and format lists parse to
// known values without duplicates, in report order, and their joined form
// parses back to the same list; errors match ErrInvalid.
func FuzzParseLists(f *testing.F) {
	for _, s := range []string{"all", "wc, pinned,PAGEABLE,zerocopy,go,mmap,pinned", "bidir,h2d", "pytorch,hostalloc", " , ", "pinned,bogus",
		"64KiB, 1MiB,,16MiB,1MiB", "json", "CSV", "1MiB,x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, p := range []struct {
			name  string
			parse func(string) ([]string, error)
			all   []string
		}{
			{"ParseKinds", ParseKinds, AllKinds()},
			{"ParseDirs", ParseDirs, AllDirs()},
			{"ParsePinMethods", ParsePinMethods, AllPinMethods()},
		} {
			got, err := p.parse(s)
			if err != nil {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("%s(%q): error %v does not match ErrInvalid", p.name, s, err)
				}
				continue
			}
			if len(got) == 0 {
				t.Fatalf("%s(%q): empty list without an error", p.name, s)
			}
			last := -1
			for _, k := range got {
				i := slices.Index(p.all, k)
				if i <= last {
					t.Fatalf("%s(%q) = %v: unknown, repeated or out of order", p.name, s, got)
				}
				last = i
			}
			if back, err := p.parse(strings.Join(got, ",")); err != nil || !slices.Equal(back, got) {
				t.Fatalf("%s(%q) = %v, but its joined form parses to %v, %v", p.name, s, got, back, err)
			}
		}
		if sizes, err := ParseSizes(s); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseSizes(%q): error %v does not match ErrInvalid", s, err)
			}
		} else {
			var parts []string
			for i, n := range sizes {
				if n < 1 || n > MaxSize || slices.Contains(sizes[:i], n) {
					t.Fatalf("ParseSizes(%q) = %v", s, sizes)
				}
				parts = append(parts, FormatSize(n))
			}
			if back, err := ParseSizes(strings.Join(parts, ",")); err != nil || !slices.Equal(back, sizes) {
				t.Fatalf("ParseSizes(%q) = %v, formatted back %v, %v", s, sizes, back, err)
			}
		}
		if fm, err := ParseFormat(s); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseFormat(%q): error %v does not match ErrInvalid", s, err)
			}
		} else if fm != FormatTable && fm != FormatJSON && fm != FormatCSV {
			t.Fatalf("ParseFormat(%q) = %q", s, fm)
		}
	})
}

// FuzzReadReport: any input gives a report or an error matching
// ErrInvalid in one line, never a panic; a report it accepts writes back to
// JSON that reads back to the same results.
func FuzzReadReport(f *testing.F) {
	for _, name := range []string{"bw.json", "pin.json", "overlap.json", "zerocopy.json", "matrix.json"} {
		if b, err := os.ReadFile(filepath.Join("testdata", name)); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{"", "{}", "null", `{"meta":{"schema_version":1},"results":[]}`, `{"meta":{"schema_version":1},"results":[null]}`,
		`{"meta":{"schema_version":1},"results":[{"bench":"bw","kind":"k","dir":"d","unit":"GB/s","median":1e309}]}`, "[", `{"meta":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rep, err := ReadReport(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q: not ErrInvalid or not one line", err)
			}
			return
		}
		var b bytes.Buffer
		if err := WriteJSON(&b, rep.Meta, rep.Results); err != nil {
			t.Fatalf("accepted report does not write back: %v", err)
		}
		back, err := ReadReport(&b)
		if err != nil || len(back.Results) != len(rep.Results) {
			t.Fatalf("round trip: %v", err)
		}
		for i := range back.Results {
			want := rep.Results[i]
			want.VerifyFailed = want.Failed() // WriteJSON marks failures
			if back.Results[i] != want {
				t.Fatalf("result %d: %+v, want %+v", i, back.Results[i], want)
			}
		}
	})
}
