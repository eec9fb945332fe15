package apicheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNotice fails when a module linked into the pinmem command or into
// pinmem/prom, at the version go.mod selects, is not named in NOTICE (whose
// license texts then need the new module's, or the new version's).
func TestNotice(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the modules are listed with the go command, and there is none here:", err)
	}
	root := filepath.Join("..", "..", "..")
	notice, err := os.ReadFile(filepath.Join(root, "NOTICE"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"go.mod", "go.sum"} { // go test's cache sees a change of either
		if _, err := os.ReadFile(filepath.Join(root, f)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}", "./cmd/pinmem", "./prom")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=amd64")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := map[string]bool{}
	for _, m := range strings.Fields(strings.ReplaceAll(string(out), " ", "@")) {
		if seen[m] {
			continue
		}
		seen[m] = true
		if !strings.Contains(string(notice), "\n  "+strings.Replace(m, "@", " ", 1)+"\n") {
			t.Errorf("NOTICE does not name %s: add the module, its license and its license text", strings.Replace(m, "@", " ", 1))
		}
	}
	if len(seen) == 0 {
		t.Fatal("go list named no module linked into cmd/pinmem")
	}
}
