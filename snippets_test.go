package pinmem_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every ```go block of README.md and docs/*.md is compiled by
// TestDocSnippets. The HTML comment lines just above a block (between the
// block's opening fence and the nearest line that is not an HTML comment)
// must hold one directive saying how:
//
//	<!-- go snippet: file -->             the block is a whole Go file
//	<!-- go snippet: decls -->            top-level declarations: compiled in
//	                                      a package of their own, with the
//	                                      imports of the packages they name
//	                                      (snippetImports) added
//	<!-- go snippet: copy of PATH -->     the block is, byte for byte, part
//	                                      of PATH, a Go file of this
//	                                      repository that its package's
//	                                      tests compile
//
// The blocks are compiled as packages of this module (go build -overlay,
// nothing is written into the tree), so they use the code of this clone.

// snippetDirective matches a directive line.
var snippetDirective = regexp.MustCompile(`^<!-- go snippet: (file|decls|copy of (\S+)) -->$`)

// snippetImports are the packages a decls block may name, by the name it
// uses: the standard library's a README shows and pinmem's public ones.
var snippetImports = map[string]string{
	"bytes": "bytes", "context": "context", "errors": "errors", "fmt": "fmt", "io": "io",
	"os": "os", "testing": "testing", "time": "time", "unsafe": "unsafe", "slog": "log/slog",
	"pinmem":      "github.com/pinmem/pinmem",
	"cuda":        "github.com/pinmem/pinmem/cuda",
	"cudatest":    "github.com/pinmem/pinmem/cudatest",
	"transfer":    "github.com/pinmem/pinmem/transfer",
	"pool":        "github.com/pinmem/pinmem/pool",
	"blocks":      "github.com/pinmem/pinmem/blocks",
	"load":        "github.com/pinmem/pinmem/load",
	"safetensors": "github.com/pinmem/pinmem/safetensors",
	"prom":        "github.com/pinmem/pinmem/prom",
	"expvars":     "github.com/pinmem/pinmem/expvars",
}

// docSnippet is one ```go block of a document.
type docSnippet struct {
	doc  string // the document's path
	line int    // the line of its opening fence
	mode string // "file", "decls" or "copy"
	path string // for "copy": the Go file it is part of
	code string
}

// docSnippets returns the ```go blocks of the document at path, each with
// its directive; a block without one, or a directive not followed by a
// block, is an error.
func docSnippets(path string) ([]docSnippet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(data), "\n")
	var out []docSnippet
	for i := 0; i < len(lines); i++ {
		if m := snippetDirective.FindStringSubmatch(lines[i]); m != nil {
			j := i + 1
			for j < len(lines) && strings.HasPrefix(lines[j], "<!--") {
				j++
			}
			if j == len(lines) || lines[j] != "```go" {
				return nil, fmt.Errorf("%s:%d: %s is not followed by a ```go block", path, i+1, lines[i])
			}
			continue
		}
		if lines[i] != "```go" {
			continue
		}
		s := docSnippet{doc: path, line: i + 1}
		for j := i - 1; j >= 0 && strings.HasPrefix(lines[j], "<!--"); j-- {
			if m := snippetDirective.FindStringSubmatch(lines[j]); m != nil {
				s.mode, s.path = m[1], m[2]
				if s.path != "" {
					s.mode = "copy"
				}
			}
		}
		if s.mode == "" {
			return nil, fmt.Errorf("%s:%d: a ```go block without a <!-- go snippet: file|decls|copy of PATH --> line above it (see snippets_test.go)", path, i+1)
		}
		end := slices.Index(lines[i+1:], "```")
		if end < 0 {
			return nil, fmt.Errorf("%s:%d: the ```go block is not closed", path, i+1)
		}
		s.code = strings.Join(lines[i+1:i+1+end], "\n") + "\n"
		out = append(out, s)
		i += end + 1
	}
	return out, nil
}

// snippetSource returns the Go file a decls block is compiled as: the
// block in package snippet, with an import of each package of
// snippetImports that it names.
func snippetSource(code string) string {
	var imports []string
	for name, path := range snippetImports {
		if regexp.MustCompile(`\b` + name + `\.`).MatchString(code) {
			imports = append(imports, fmt.Sprintf("%q", path))
		}
	}
	slices.Sort(imports)
	return "package snippet\n\nimport (\n\t" + strings.Join(imports, "\n\t") + "\n)\n\n" + code
}

func TestDocSnippets(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var snippets []docSnippet
	for _, d := range append([]string{"README.md"}, docs...) {
		s, err := docSnippets(d)
		if err != nil {
			t.Fatal(err)
		}
		snippets = append(snippets, s...)
	}
	if len(snippets) == 0 {
		t.Fatal("README.md holds no ```go block")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	var names []string // the temporary file of each compiled snippet, then its place
	for i, s := range snippets {
		name := fmt.Sprintf("%s:%d", s.doc, s.line)
		switch s.mode {
		case "copy":
			src, err := os.ReadFile(filepath.FromSlash(s.path))
			if err != nil {
				t.Errorf("%s: copy of %s: %v", name, s.path, err)
			} else if !strings.HasSuffix(s.path, ".go") || !strings.Contains(string(src), s.code) {
				t.Errorf("%s: the block is not part of %s byte for byte", name, s.path)
			}
			continue
		case "decls":
			s.code = snippetSource(s.code)
		}
		file := filepath.Join(tmp, fmt.Sprintf("snippet%d.go", i))
		if err := os.WriteFile(file, []byte(s.code), 0o644); err != nil {
			t.Fatal(err)
		}
		// A directory of this module that does not exist: the overlay
		// alone holds the package.
		dir := fmt.Sprintf("internal/docsnippet%d", i)
		overlay[filepath.Join(root, dir, "snippet.go")] = file
		pkgs = append(pkgs, "./"+dir)
		names = append(names, file, name+" (as "+dir+")")
	}
	if len(pkgs) == 0 {
		return
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command here to compile the snippets with (the GPU machine runs test binaries only)")
	}
	ov, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ovPath := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ovPath, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, pkg := range pkgs {
		// One package at a time: -o discards what it builds, main or not.
		cmd := exec.Command(gobin, "build", "-overlay", ovPath, "-o", os.DevNull, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("a document's Go snippet does not compile (go build): %v\n%s", err, strings.NewReplacer(names...).Replace(string(out)))
		}
	}
}
