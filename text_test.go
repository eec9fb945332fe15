package pinmem_test

import (
	"encoding/json"
	"errors"
	"flag"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// checkNameError checks that err is a *pinmem.NameError for typ and name.
func checkNameError(t *testing.T, err error, typ, name string) {
	t.Helper()
	var ne *pinmem.NameError
	if !errors.As(err, &ne) || ne.Type != typ || ne.Name != name || len(ne.Known) == 0 {
		t.Errorf("error %v: want a *pinmem.NameError for %s %q listing the known names", err, typ, name)
	}
}

func TestMethodText(t *testing.T) {
	err := testutil.CheckText(t, []pinmem.Method{pinmem.MethodAuto, pinmem.MethodHostAlloc, pinmem.MethodMmapRegister}, pinmem.Method(9), "mmap")
	checkNameError(t, err, "pinmem.Method", "mmap")
}

func TestFlagsText(t *testing.T) {
	all := []pinmem.Flags{0, pinmem.Portable, pinmem.Mapped, pinmem.WriteCombined, pinmem.ReadOnly,
		pinmem.Portable | pinmem.Mapped, pinmem.Portable | pinmem.Mapped | pinmem.WriteCombined | pinmem.ReadOnly}
	err := testutil.CheckText(t, all, pinmem.Flags(1<<7), "pinned")
	checkNameError(t, err, "pinmem.Flags", "pinned")
	// Names in any order, an empty name refused.
	var f pinmem.Flags
	if err := f.UnmarshalText([]byte("mapped|Portable")); err != nil || f != pinmem.Portable|pinmem.Mapped {
		t.Errorf("mapped|Portable: %v %v", f, err)
	}
	checkNameError(t, f.UnmarshalText([]byte("mapped|")), "pinmem.Flags", "")
}

// The enums work as command-line flags and JSON values, as a service
// sets them from flags or configuration.
func TestEnumsAsFlagAndJSON(t *testing.T) {
	fs := flag.NewFlagSet("app", flag.ContinueOnError)
	var m pinmem.Method
	var f pinmem.Flags
	fs.TextVar(&m, "method", pinmem.MethodAuto, "pinning method")
	fs.TextVar(&f, "flags", pinmem.Flags(0), "pinning flags")
	if err := fs.Parse([]string{"-method", "mmap-register", "-flags", "portable|mapped"}); err != nil {
		t.Fatal(err)
	}
	if m != pinmem.MethodMmapRegister || f != pinmem.Portable|pinmem.Mapped {
		t.Errorf("parsed %v %v", m, f)
	}
	var cfg struct {
		Method pinmem.Method `json:"method"`
		Flags  pinmem.Flags  `json:"flags"`
	}
	if err := json.Unmarshal([]byte(`{"method":"hostalloc","flags":"writecombined"}`), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Method != pinmem.MethodHostAlloc || cfg.Flags != pinmem.WriteCombined {
		t.Errorf("decoded %+v", cfg)
	}
	err := json.Unmarshal([]byte(`{"method":"pinned"}`), &cfg)
	checkNameError(t, err, "pinmem.Method", "pinned")
}
