package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem/internal/tools/bench"
)

// readBuildInfo is debug.ReadBuildInfo (a test hook).
var readBuildInfo = debug.ReadBuildInfo

// stampedRevision and stampedModified are the VCS revision and whether the
// tree was modified, set at link time by the project's build scripts
// (-ldflags "-X main.stampedRevision=... -X main.stampedModified=true")
// for builds where Go records none: a git worktree, whose .git is a file,
// a copy of the tree without .git, or GOFLAGS=-buildvcs=false.
var stampedRevision, stampedModified string

// toolInfo describes this build from the module's build information: the
// module version ("(devel)" for a build from a checkout), the VCS revision
// and whether the tree was modified (when the build recorded them), and
// the Go version.
func toolInfo() bench.Tool {
	t := bench.Tool{Name: "pinmem", Version: "(unknown)", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH, Changelog: changelogVersion}
	t.Revision = stampedRevision
	if stampedModified != "" {
		t.Modified = new(stampedModified == "true")
	}
	bi, ok := readBuildInfo()
	if !ok {
		return t
	}
	if bi.Main.Version != "" {
		t.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		t.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			t.Revision = s.Value
		case "vcs.modified":
			t.Modified = new(s.Value == "true")
		}
	}
	return t
}

// versionLine is what --version and `pinmem version` print.
func versionLine() string {
	t := toolInfo()
	s := "pinmem " + t.Version
	if t.Revision != "" {
		s += " (revision " + t.Revision
		if t.Modified != nil && *t.Modified {
			s += ", modified"
		}
		s += ")"
	} else {
		s += " (revision unknown: build with scripts/gpu-suite build or go build -buildvcs=true from a git clone)"
	}
	return s + fmt.Sprintf(", %s %s/%s, CHANGELOG.md %s", t.GoVersion, runtime.GOOS, runtime.GOARCH, t.Changelog)
}

// changelogVersion is the CHANGELOG.md version this source contains: the
// latest version the CHANGELOG names, with "+unreleased" while it lists
// changes under [Unreleased] (TestChangelogVersion keeps it so). Versions
// are not tagged yet: the revision says which commit a build is.
const changelogVersion = "0.1.0+unreleased"

func newVersion() *cobra.Command {
	var format string
	c := &cobra.Command{
		Use:   "version",
		Short: "Print the version, VCS revision, Go version and CHANGELOG version of this build",
		Long: `version prints the module version ("(devel)" for a build from a clone), the
VCS revision and whether the tree was modified (where the build recorded
them, or the build scripts stamped them), the Go version and platform, and
which CHANGELOG.md version the build's source contains ("0.1.0+unreleased":
0.1.0 and the changes listed under [Unreleased]). --format json writes the
same as the "tool" object of a result file; "modified" is left out when the
build does not know it.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch format {
			case "table", "text":
				_, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine())
				return err
			case "json":
				b, err := json.MarshalIndent(toolInfo(), "", "  ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
				return err
			}
			return usagef("--format %q: want table or json", format)
		},
	}
	c.Flags().StringVar(&format, "format", "table", "output format: table or json")
	_ = c.RegisterFlagCompletionFunc("format", fixedCompletion("table", "json"))
	return c
}
