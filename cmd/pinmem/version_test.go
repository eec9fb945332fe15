package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// changelogText is the repository's CHANGELOG.md.
func changelogText(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestChangelogVersion: changelogVersion is the latest version CHANGELOG.md
// names, with +unreleased while [Unreleased] lists changes, and version
// says it.
func TestChangelogVersion(t *testing.T) {
	cl := changelogText(t)
	latest := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+[^\]]*)\]`).FindStringSubmatch(cl)
	if latest == nil {
		t.Fatal("CHANGELOG.md names no version")
	}
	want := latest[1]
	_, rest, _ := strings.Cut(cl, "## [Unreleased]")
	unreleased, _, _ := strings.Cut(rest, "\n## [")
	if strings.Contains(unreleased, "\n- ") {
		want += "+unreleased"
	}
	if changelogVersion != want {
		t.Errorf("changelogVersion = %q; CHANGELOG.md says %q: update cmd/pinmem/version.go", changelogVersion, want)
	}
	stdout, _, code := cli(t, "version")
	if code != exitOK || !strings.Contains(stdout, "CHANGELOG.md "+want) {
		t.Errorf("version: %d %q", code, stdout)
	}
}

// TestChangelogLinksExist: CHANGELOG.md links no release tag or tag
// comparison (none is published: a tag made in one clone may never reach
// the shared repository), and every relative link names a file of the
// repository.
func TestChangelogLinksExist(t *testing.T) {
	cl := changelogText(t)
	for _, bad := range []string{"/releases/tag/", "/compare/v", "/tree/v"} {
		if strings.Contains(cl, bad) {
			t.Errorf("CHANGELOG.md links a tag (%s): no version is tagged", bad)
		}
	}
	for _, m := range regexp.MustCompile(`\]\(([^)#]+)(#[^)]*)?\)`).FindAllStringSubmatch(cl, -1) {
		target := m[1]
		if strings.Contains(target, "://") {
			continue
		}
		if _, err := os.Stat(filepath.Join("..", "..", filepath.FromSlash(target))); err != nil {
			t.Errorf("CHANGELOG.md links %s: %v", target, err)
		}
	}
}

// TestVersionJSONWithoutVCS: a build that knows nothing of its tree
// leaves "modified" out of version --format json, not false.
func TestVersionJSONWithoutVCS(t *testing.T) {
	old, oldMod := readBuildInfo, stampedModified
	defer func() { readBuildInfo, stampedModified = old, oldMod }()
	stampedModified = ""
	readBuildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/pinmem/pinmem", Version: "(devel)"}}, true
	}
	stdout, _, code := cli(t, "version", "--format", "json")
	var got map[string]any
	if err := json.Unmarshal([]byte(stdout), &got); err != nil || code != exitOK {
		t.Fatalf("version --format json: %d %v %q", code, err, stdout)
	}
	if _, ok := got["modified"]; ok {
		t.Errorf("modified is %v for a build without VCS information; want it left out", got["modified"])
	}
	if got["changelog"] != changelogVersion {
		t.Errorf("changelog %v, want %s", got["changelog"], changelogVersion)
	}
	stampedModified = "false"
	stdout, _, _ = cli(t, "version", "--format", "json")
	if !strings.Contains(stdout, `"modified": false`) {
		t.Errorf("a stamped clean tree: %s", stdout)
	}
}
