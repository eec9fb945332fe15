// Package apicheck writes down the exported surface of pinmem's public
// packages, one line per exported identifier in the style of Go's api/*.txt,
// and checks it against the API file api/pinmem.txt and the per-package
// budget api/budget.txt. Its test runs in `go test ./...`: it fails when the
// surface changes and the API file does not, and when a package has more
// exported identifiers than its budget allows.
//
// After an intended change of the surface, rewrite the API file with one
// command from the repository root:
//
//	go test ./internal/tools/apicheck -update
//
// and commit api/pinmem.txt and api/budget.txt with the change. The same
// command lowers each package's budget to what the package exports and adds
// one for a new package; it never raises one: a package that grows past its
// budget needs api/budget.txt edited by hand, a decision made in the change
// that makes it grow.
//
// A budget counts a package's non-constant identifiers: package-level
// functions, types and variables and the exported methods of its types.
// Struct fields and interface methods are listed but counted with their
// type; constants are counted apart, and those whose type transcribes a
// table of CUDA's or safetensors' (the "table" lines of api/budget.txt) apart
// again. TestBudget logs every package's counts (go test -v).
//
// The surface is read from the compiler's export data (go list -export), for
// linux/amd64, so that the lines say what a user of the package can name:
// package-level constants, variables, functions and types, the exported
// methods declared on exported types, exported struct fields and interface
// methods, of every package of the module that is not a command and not
// under internal/ or examples/. Each line is one of
//
//	pkg P, const Name Type = value
//	pkg P, var Name Type
//	pkg P, func Name(params) results
//	pkg P, method (Recv) Name(params) results
//	pkg P, type Name underlying            (struct, interface or another type)
//	pkg P, type Name struct, Field Type    (embedded Type for an embedded field)
//	pkg P, type Name interface, Method(params) results
//
// where P is the import path without the "github.com/pinmem/" prefix and
// parameter names are left out, as Go's api files do.
//
// The package's tests also check that NOTICE names every module linked into
// the pinmem command and into pinmem/prom, at the version go.mod selects.
package apicheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Kind sorts an exported identifier for the budget.
type Kind int

const (
	// NonConst is every identifier that is not a constant: what a budget
	// limits.
	NonConst Kind = iota
	// Const is a constant of pinmem's own.
	Const
	// TableConst is a constant whose type transcribes a table of CUDA's or
	// safetensors' (an attribute, an error code, a dtype): it follows the
	// table, not a design decision, and is counted apart.
	TableConst
	// Member is an exported struct field or interface method: written in
	// the API file, so that a change to it shows, but counted with its type
	// rather than on its own.
	Member
)

// Line is one exported identifier.
type Line struct {
	Pkg  string // import path without the module's owner prefix, e.g. "pinmem/cuda"
	Text string // the whole line, "pkg Pkg, ..."
	Kind Kind
	// ConstType is the named type of a constant ("pinmem/cuda.Attribute"),
	// empty for other kinds and for untyped constants.
	ConstType string
}

// pathPrefix is cut from import paths in the lines.
const pathPrefix = "github.com/pinmem/"

// listed is what `go list -json` says of a package.
type listed struct {
	ImportPath string
	Name       string
	Export     string
	Dir        string
	GoFiles    []string
	Module     *struct{ Main bool }
	Error      *struct{ Err string }
}

// public reports whether a package of the main module is part of the
// public surface: not a command, not under an internal/ folder, and not
// under examples/ (whose packages serve the example programs).
func public(p listed) bool {
	if p.Module == nil || !p.Module.Main || p.Name == "main" {
		return false
	}
	elems := strings.Split(p.ImportPath, "/")
	return !slices.Contains(elems, "internal") && !slices.Contains(elems, "examples")
}

// Surface returns the exported surface of the public packages matched by
// patterns (run from dir, the module root or below), sorted by package and
// text, and the Go files of the main module it was read from (the public
// packages and what they import). tables names the types whose constants
// are TableConst, as "pinmem/cuda.Attribute".
func Surface(dir string, tables map[string]bool, patterns ...string) (lines []Line, files []string, err error) {
	args := append([]string{"list", "-deps", "-export", "-e", "-json=ImportPath,Name,Dir,GoFiles,Export,Module,Error"}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	// One platform, so that the file does not depend on where it is made.
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=amd64")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("go %s: %v: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	exports := map[string]string{}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("reading go list's output: %w", err)
		}
		if p.Error != nil {
			return nil, nil, fmt.Errorf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		exports[p.ImportPath] = p.Export
		if p.Module != nil && p.Module.Main {
			for _, f := range p.GoFiles {
				files = append(files, filepath.Join(p.Dir, f))
			}
		}
		if public(p) {
			pkgs = append(pkgs, p)
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	for _, p := range pkgs {
		pkg, err := imp.Import(p.ImportPath)
		if err != nil {
			return nil, nil, fmt.Errorf("reading the export data of %s: %w", p.ImportPath, err)
		}
		lines = append(lines, walk(pkg, tables)...)
	}
	slices.SortFunc(lines, func(a, b Line) int {
		if c := strings.Compare(a.Pkg, b.Pkg); c != 0 {
			return c
		}
		return strings.Compare(a.Text, b.Text)
	})
	return slices.CompactFunc(lines, func(a, b Line) bool { return a.Text == b.Text }), files, nil
}

// short is an import path as the lines write it.
func short(path string) string { return strings.TrimPrefix(path, pathPrefix) }

// walk lists the exported identifiers of pkg.
func walk(pkg *types.Package, tables map[string]bool) []Line {
	name := short(pkg.Path())
	qual := func(other *types.Package) string {
		if other == pkg {
			return ""
		}
		return other.Name()
	}
	typ := func(t types.Type) string { return types.TypeString(t, qual) }
	var lines []Line
	add := func(kind Kind, format string, args ...any) {
		lines = append(lines, Line{Pkg: name, Text: "pkg " + name + ", " + fmt.Sprintf(format, args...), Kind: kind})
	}
	scope := pkg.Scope()
	for _, n := range scope.Names() {
		obj := scope.Lookup(n)
		if !obj.Exported() {
			continue
		}
		switch o := obj.(type) {
		case *types.Const:
			kind, ctype := Const, ""
			if nt, ok := o.Type().(*types.Named); ok && nt.Obj().Pkg() != nil {
				ctype = short(nt.Obj().Pkg().Path()) + "." + nt.Obj().Name()
				if tables[ctype] {
					kind = TableConst
				}
			}
			add(kind, "const %s %s = %s", n, typ(o.Type()), o.Val().ExactString())
			lines[len(lines)-1].ConstType = ctype
		case *types.Var:
			add(NonConst, "var %s %s", n, typ(o.Type()))
		case *types.Func:
			add(NonConst, "func %s%s", n, signature(o.Type().(*types.Signature), typ))
		case *types.TypeName:
			walkType(o, typ, add)
		}
	}
	return lines
}

// walkType lists a type, its exported fields or interface methods, and the
// exported methods declared on it. An alias of an internal package's type
// (which a user cannot name) is listed as that type, under the alias's name:
// its fields are the public surface.
func walkType(o *types.TypeName, typ func(types.Type) string, add func(Kind, string, ...any)) {
	n := o.Name()
	t := o.Type()
	if a, ok := t.(*types.Alias); ok {
		target, ok := a.Rhs().(*types.Named)
		if !ok || target.Obj().Pkg() == nil || !slices.Contains(strings.Split(target.Obj().Pkg().Path(), "/"), "internal") {
			add(NonConst, "type %s = %s", n, typ(a.Rhs()))
			return
		}
		t = target
	}
	named, ok := t.(*types.Named)
	if !ok {
		add(NonConst, "type %s %s", n, typ(t.Underlying()))
		return
	}
	head := n + typeParams(named.TypeParams(), typ)
	switch u := named.Underlying().(type) {
	case *types.Struct:
		add(NonConst, "type %s struct", head)
		for f := range u.Fields() {
			switch {
			case !f.Exported():
			case f.Embedded():
				add(Member, "type %s struct, embedded %s", head, typ(f.Type()))
			default:
				add(Member, "type %s struct, %s %s", head, f.Name(), typ(f.Type()))
			}
		}
	case *types.Interface:
		var names []string
		for m := range u.Methods() {
			if m.Exported() {
				names = append(names, m.Name())
			} else {
				names = append(names, "unexported methods")
			}
		}
		add(NonConst, "type %s interface { %s }", head, strings.Join(slices.Compact(names), ", "))
		for m := range u.Methods() {
			if m.Exported() {
				add(Member, "type %s interface, %s%s", head, m.Name(), signature(m.Type().(*types.Signature), typ))
			}
		}
	default:
		add(NonConst, "type %s %s", head, typ(u))
	}
	for m := range named.Methods() {
		if !m.Exported() {
			continue
		}
		sig := m.Type().(*types.Signature)
		recv := n
		if tp := sig.RecvTypeParams(); tp.Len() > 0 {
			var names []string
			for t := range tp.TypeParams() {
				names = append(names, t.Obj().Name())
			}
			recv += "[" + strings.Join(names, ", ") + "]"
		}
		if _, ptr := sig.Recv().Type().(*types.Pointer); ptr {
			recv = "*" + n
		}
		add(NonConst, "method (%s) %s%s", recv, m.Name(), signature(sig, typ))
	}
}

// typeParams writes a type parameter list, "[T any]", or nothing.
func typeParams(tp *types.TypeParamList, typ func(types.Type) string) string {
	if tp.Len() == 0 {
		return ""
	}
	var parts []string
	for t := range tp.TypeParams() {
		parts = append(parts, t.Obj().Name()+" "+typ(t.Constraint()))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// signature writes a function's parameters and results without their
// names: "(context.Context, int) error".
func signature(sig *types.Signature, typ func(types.Type) string) string {
	tuple := func(t *types.Tuple, variadic bool) []string {
		var parts []string
		for i := range t.Len() {
			s := typ(t.At(i).Type())
			if variadic && i == t.Len()-1 {
				s = "..." + typ(t.At(i).Type().(*types.Slice).Elem())
			}
			parts = append(parts, s)
		}
		return parts
	}
	s := typeParams(sig.TypeParams(), typ) + "(" + strings.Join(tuple(sig.Params(), sig.Variadic()), ", ") + ")"
	switch res := tuple(sig.Results(), false); len(res) {
	case 0:
	case 1:
		s += " " + res[0]
	default:
		s += " (" + strings.Join(res, ", ") + ")"
	}
	return s
}
