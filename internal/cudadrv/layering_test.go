package cudadrv_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/pinmem/pinmem"

// layer ranks pinmem's packages (paths relative to the module root; ""
// is the root package pinmem). Data flows one way, from higher layers to
// lower ones: a package may import only packages of a lower rank.
var layer = map[string]int{
	"internal/hostptr": -1, "internal/cudadrv": 0, "internal/track": 0, "internal/sysinfo": 0, "internal/kernels": 0,
	"internal/cudadrv/fakedrv": 1, "cuda": 1, "internal/numaplan": 1,
	"internal/testutil": 2, "": 2,
	"pool":     3,
	"transfer": 4, "prom": 4, "expvars": 4,
	"internal/bench": 5, "internal/diag": 5,
	"cmd/pinmem": 6,
}

// TestLayering is pinmem's depguard: only internal/cudadrv (and its fake)
// may import unsafe or purego, and no package imports one above it
// (cmd -> bench/diag -> transfer/prom -> pool -> pinmem -> cuda ->
// internal/cudadrv). Test files are exempt (tests may use the raw binding).
func TestLayering(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n != "." && (strings.HasPrefix(n, ".") || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		if pkg == "." {
			pkg = ""
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		mine, ranked := layer[pkg]
		if strings.HasPrefix(pkg, "examples/") {
			mine, ranked = 7, true
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if (p == "unsafe" || strings.HasPrefix(p, "github.com/ebitengine/purego")) && !strings.HasPrefix(pkg, "internal/cudadrv") && pkg != "internal/hostptr" {
				t.Errorf("%s imports %s: only internal/cudadrv and internal/hostptr may", path, p)
			}
			if !strings.HasPrefix(p, module) {
				continue
			}
			target := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
			theirs, known := layer[target]
			if !ranked || !known {
				t.Errorf("%s imports %s: package %q or %q has no layer in TestLayering", path, p, pkg, target)
				continue
			}
			if theirs >= mine {
				t.Errorf("%s (layer %d) imports %s (layer %d): imports must point down", path, mine, p, theirs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files under %s: the walk is broken", checked, root)
	}
}
