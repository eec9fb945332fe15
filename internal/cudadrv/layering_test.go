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
	"internal/reclaim":  -1, // pinmem's budget reclaimers, for pool and transfer
	"internal/freehook": -1, // lets package remote drop a registration before pinmem frees a buffer
	"internal/hostptr":  -1, "internal/testhook": -1, "internal/cudadrv": 0, "internal/track": 0, "internal/sysinfo": 0, "internal/kernels": 0, "internal/units": 0,
	"internal/cpuclock":        -1, // thread and process CPU time
	"internal/regfile":         -1, // regular files opened without blocking, for load and safetensors
	"internal/enumtext":        -1, // the names of the enums set from flags or configuration
	"internal/copypool":        0,  // the staging engine's copy goroutines
	"remote/internal/ucx":      0,  // the UCX binding (libucp through purego), for package remote
	"internal/pagenode":        0,  // the NUMA node of pages (move_pages)
	"internal/cudadrv/fakedrv": 1, "cuda": 1, "internal/numaplan": 1,
	"internal/budgetspec":     2, // the budget as PINMEM_BUDGET and the command give it
	"internal/pinopt":         2, // pinmem's options (a *cuda.Device among them) and their validation, for pinmem and pool
	"internal/lifecycle":      2, // the owners' gate, retryable release, orphans and Close, for pinmem, pool, blocks, load and transfer
	"internal/cudaerr":        2, // the binding's errors as cuda's types, for the packages above cuda that call the binding
	"internal/tools/testutil": 3, "": 3,
	"pool": 4, "cudatest": 4, "blocks": 4,
	"load": 4, "safetensors": 5, // the weight loader and the safetensors reader on top of it
	"internal/hostspan":          4, // the pinned spans of host memory, for transfer and its registration cache
	"remote":                     4, // pinned memory between processes and machines over UCX
	"transfer/internal/regcache": 5, // transfer's registration cache
	"transfer":                   6, "prom": 6, "expvars": 6,
	"internal/tools/bench": 7, "cmd/pinmem/internal/diag": 7,
	"cmd/pinmem/internal/remotebench": 7, // pinmem bench remote
	"cmd/pinmem":                      8,
}

// bindingImporters are the only packages that may import internal/cudadrv,
// the raw driver binding, each with the reason it may. Every other package
// reaches the driver through package cuda, even where the layer ranks
// would allow the import: a new edge into the binding needs an entry here,
// and an entry whose package no longer imports the binding must go.
var bindingImporters = map[string]string{
	"cuda":                     "the public face of the driver: devices, contexts, streams, device memory, modules",
	"internal/cudadrv/fakedrv": "implements the binding's Driver interface for CPU tests",
	"":                         "the host-memory face of the driver beside cuda: cuMemHostAlloc/Register, mapped pointers, pointer attributes, with the ledger that accounts for them",
	"cmd/pinmem/internal/diag": "doctor reports which driver library is loaded and the variable that chooses it",
	"internal/tools/testutil":  "tests install the fake driver and detect the real one",
	"internal/cudaerr":         "converts the binding's errors into cuda's types for the packages above cuda that call the binding",
	"blocks":                   "block lists need the driver's batch copy (cuMemcpyBatchAsync), copies queued 16 per crossing (RunBatch) and host pointer attributes, which cuda does not offer",
	"cudatest":                 "hands users' options, faults, stream holds and kernels to the fake driver, whose API speaks the binding's types (CUresult, attributes, handles)",
}

// upImports are the only shared internal packages (internal/, not its
// tools/ floor, whose packages serve the command, tests and scripts from
// above) that may import a public package, each with the reason. The
// shared floor sits below the public packages it serves: an import up
// needs an entry here.
var upImports = map[string]string{
	"internal/budgetspec": "its errors match cuda.ErrInvalidValue, as every refused budget of pinmem does",
	"internal/cudaerr":    "converts the binding's errors into cuda's types",
	"internal/lifecycle":  "a closed owner's error matches cuda.ErrClosed",
	"internal/pinopt":     "pinmem's options name a *cuda.Device",
	"internal/hostspan":   "a slice's pinned spans are found with pinmem.Lookup",
}

// TestLayering is pinmem's depguard: only internal/cudadrv (and its fake),
// remote/internal/ucx and internal/hostptr may import unsafe or purego, no package imports one
// above it (cmd -> bench/diag -> transfer/prom -> regcache -> pool/hostspan
// -> pinmem -> cuda -> internal/cudadrv), and only the packages in bindingImporters import the
// binding itself. Test files are exempt (tests may use the raw binding).
func TestLayering(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	binding := map[string]bool{} // packages seen importing internal/cudadrv
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
			mine, ranked = 8, true
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if (p == "unsafe" || strings.HasPrefix(p, "github.com/ebitengine/purego")) && !strings.HasPrefix(pkg, "internal/cudadrv") && pkg != "internal/hostptr" && pkg != "remote/internal/ucx" {
				t.Errorf("%s imports %s: only internal/cudadrv, remote/internal/ucx (the two library bindings) and internal/hostptr may", path, p)
			}
			if !strings.HasPrefix(p, module) {
				continue
			}
			target := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
			if strings.HasPrefix(pkg, "examples/") && strings.HasPrefix(target, "examples/") {
				continue // the examples' own helpers (kernels, test support) sit beside them, above the library
			}
			if strings.HasPrefix(pkg, "internal/") && !strings.HasPrefix(pkg, "internal/tools/") && !strings.Contains(target, "internal/") {
				if _, ok := upImports[pkg]; !ok {
					t.Errorf("%s imports the public package %s: shared internal packages sit below the public ones; move it under its owner or add it to upImports with the reason", path, p)
				}
			}
			if target == "internal/cudadrv" {
				binding[pkg] = true
				if _, ok := bindingImporters[pkg]; !ok {
					t.Errorf("%s imports %s: package %q is not in bindingImporters; reach the driver through package cuda, or add it there with the reason", path, p, pkg)
				}
			}
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
	for pkg := range bindingImporters {
		if !binding[pkg] {
			t.Errorf("bindingImporters lists %q, which no longer imports internal/cudadrv: remove the entry", pkg)
		}
	}
	if checked < 50 {
		t.Fatalf("checked only %d files under %s: the walk is broken", checked, root)
	}
}
