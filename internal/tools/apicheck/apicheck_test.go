package apicheck

import (
	"flag"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

var update = flag.Bool("update", false, "rewrite api/pinmem.txt from the exported surface, and lower api/budget.txt's budgets to it")

// The API file and the budget file, from this package's folder.
var (
	apiFile    = filepath.Join("..", "..", "..", "api", "pinmem.txt")
	budgetFile = filepath.Join("..", "..", "..", "api", "budget.txt")
)

// regenerate is the command that rewrites the API file.
const regenerate = "go test ./internal/tools/apicheck -update"

// read is what surface read first: the tests that need the surface share
// one run of go list, the slow part.
var read struct {
	sync.Mutex
	done  bool
	lines []Line
	b     Budget
}

// surface reads the module's public surface with the budget file's tables,
// once per test binary.
func surface(t *testing.T) ([]Line, Budget) {
	t.Helper()
	read.Lock()
	defer read.Unlock()
	if !read.done || *update { // -update rewrites the budget file: read it again
		read.lines, read.b = readSurface(t)
		read.done = true
	}
	return read.lines, read.b
}

func readSurface(t *testing.T) ([]Line, Budget) {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		// A test binary carried to a machine without Go (the GPU suite).
		t.Skip("the surface is read with the go command, and there is none here:", err)
	}
	text, err := os.ReadFile(budgetFile)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseBudget(string(text))
	if err != nil {
		t.Fatal(err)
	}
	lines, files, err := Surface(filepath.Join("..", "..", ".."), b.Tables, "./...")
	if err != nil {
		t.Fatal(err)
	}
	// go list read the sources in a child process, which go test's cache
	// does not see: open them here, so that a change to any of them runs
	// this test again rather than reporting a cached pass.
	for _, f := range files {
		if _, err := os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	}
	return lines, b
}

// TestAPIFile fails when the exported surface differs from api/pinmem.txt.
func TestAPIFile(t *testing.T) {
	lines, b := surface(t)
	var got []string
	for _, l := range lines {
		got = append(got, l.Text)
	}
	text := strings.Join(got, "\n") + "\n"
	if *update {
		if err := os.WriteFile(apiFile, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(budgetFile, []byte(b.Lower(lines).Format()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	old, err := os.ReadFile(apiFile)
	if err != nil {
		t.Fatalf("%v: write it with `%s`", err, regenerate)
	}
	if string(old) == text {
		return
	}
	d := Diff(strings.Split(strings.TrimSuffix(string(old), "\n"), "\n"), got)
	if len(d) == 0 {
		t.Fatalf("api/pinmem.txt holds the surface's lines but not sorted one a line: rewrite it with `%s`", regenerate)
	}
	t.Fatalf("the exported surface differs from api/pinmem.txt (- only in the file, + only in the code):\n%s\nIf the change is intended, rewrite the file with `%s` and commit it.",
		strings.Join(d, "\n"), regenerate)
}

// TestBudget fails when a package exports more non-constant identifiers
// than api/budget.txt allows, and logs every package's counts.
func TestBudget(t *testing.T) {
	lines, b := surface(t)
	counts := Counts(lines)
	var total Count
	for _, p := range slices.Sorted(func(yield func(string) bool) {
		for p := range counts {
			if !yield(p) {
				return
			}
		}
	}) {
		c := counts[p]
		t.Logf("%-18s non-constant %3d (budget %3d)  constants %3d  table constants %3d  fields and interface methods %3d",
			p, c.NonConst, b.Max[p], c.Const, c.TableConst, c.Member)
		total.NonConst += c.NonConst
		total.Const += c.Const
		total.TableConst += c.TableConst
		total.Member += c.Member
	}
	t.Logf("%-18s non-constant %3d                constants %3d  table constants %3d  fields and interface methods %3d",
		"total", total.NonConst, total.Const, total.TableConst, total.Member)
	if *update {
		return // TestAPIFile lowered the budgets
	}
	if p := b.Check(lines); len(p) > 0 {
		t.Fatalf("api/budget.txt:\n%s\nShrink the surface, or raise the budget in api/budget.txt by hand if the growth is decided.", strings.Join(p, "\n"))
	}
}

// walkSource type-checks one file as package example.com/p and walks it.
func walkSource(t *testing.T, src string, tables map[string]bool) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	conf := types.Config{Importer: importer.Default()}
	pkg, err := conf.Check("example.com/p", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range walk(pkg, tables) {
		out = append(out, string("NCTM"[l.Kind])+" "+l.Text)
	}
	slices.Sort(out)
	return out
}

// TestWalk checks the line of each kind of declaration and which
// identifiers are left out.
func TestWalk(t *testing.T) {
	src := `package p

import "io"

type Code int

const (
	A Code = iota + 1
	B
	c
)

const Max = 1 << 10

var ErrX error

type S struct {
	io.Reader
	F, g int
	H    func(...string) error
}

func (S) Get(int, string) (n int, err error) { return 0, nil }
func (*S) Set(v ...byte)                    {}
func (S) hidden()                           {}

type I interface {
	Do(x int) bool
	io.Closer
}

type List[E any] []E

func (l List[E]) Len() int { return len(l) }

type Alias = S

func New(r io.Reader) *S { return nil }
func unexported()        {}

type s2 struct{}

func (s2) Visible() {}
`
	got := walkSource(t, src, map[string]bool{"example.com/p.Code": true})
	want := []string{
		"C pkg example.com/p, const Max untyped int = 1024",
		"M pkg example.com/p, type I interface, Close() error",
		"M pkg example.com/p, type I interface, Do(int) bool",
		"M pkg example.com/p, type S struct, F int",
		"M pkg example.com/p, type S struct, H func(...string) error",
		"M pkg example.com/p, type S struct, embedded io.Reader",
		"N pkg example.com/p, func New(io.Reader) *S",
		"N pkg example.com/p, method (*S) Set(...byte)",
		"N pkg example.com/p, method (List[E]) Len() int",
		"N pkg example.com/p, method (S) Get(int, string) (int, error)",
		"N pkg example.com/p, type Alias = S",
		"N pkg example.com/p, type Code int",
		"N pkg example.com/p, type I interface { Close, Do }",
		"N pkg example.com/p, type List[E any] []E",
		"N pkg example.com/p, type S struct",
		"N pkg example.com/p, var ErrX error",
		"T pkg example.com/p, const A Code = 1",
		"T pkg example.com/p, const B Code = 2",
	}
	if !slices.Equal(got, want) {
		t.Errorf("walk:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Without the table, A and B are pinmem's own constants.
	for _, l := range walkSource(t, src, nil) {
		if strings.HasPrefix(l, "T ") {
			t.Errorf("without tables: %s", l)
		}
	}
}

// TestBudgetCheck covers a package over budget, one without a budget, a
// stale table line, and Lower.
func TestBudgetCheck(t *testing.T) {
	b, err := ParseBudget("# comment\nbudget a 2\nbudget gone 5\ntable a.T\ntable a.Old\n")
	if err != nil {
		t.Fatal(err)
	}
	lines := []Line{
		{Pkg: "a", Kind: NonConst}, {Pkg: "a", Kind: NonConst}, {Pkg: "a", Kind: NonConst},
		{Pkg: "a", Kind: TableConst, ConstType: "a.T"}, {Pkg: "a", Kind: Member},
		{Pkg: "b", Kind: NonConst}, {Pkg: "b", Kind: Const},
	}
	want := []string{
		"a exports 3 non-constant identifiers, 1 over its budget of 2",
		"b exports 1 non-constant identifiers and has no budget",
		"table a.Old: no exported constant has this type",
	}
	if got := b.Check(lines); !slices.Equal(got, want) {
		t.Errorf("Check = %q, want %q", got, want)
	}
	// Lower keeps a's budget (never raises it), adds b, drops gone.
	low := b.Lower(lines).Format()
	if want := "# comment\nbudget a 2\nbudget b 1\ntable a.Old\ntable a.T\n"; low != want {
		t.Errorf("Lower = %q, want %q", low, want)
	}
	if got := b.Lower(lines[3:]).Max["a"]; got != 0 {
		t.Errorf("Lower with no non-constant identifier in a: budget %d, want 0", got)
	}
	for _, bad := range []string{"budget a", "budget a -1", "budget a 1\nbudget a 2", "tables a.T", "table T"} {
		if _, err := ParseBudget(bad); err == nil {
			t.Errorf("ParseBudget(%q) = nil error", bad)
		}
	}
}

func TestDiff(t *testing.T) {
	got := Diff([]string{"a", "b", "d"}, []string{"a", "c", "d", "e"})
	if want := []string{"- b", "+ c", "+ e"}; !slices.Equal(got, want) {
		t.Errorf("Diff = %q, want %q", got, want)
	}
}
