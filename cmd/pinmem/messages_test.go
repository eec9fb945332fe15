package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestMessagesSayWhatIsWrong: each bad command line gets exit status 2 and
// one line in the user's terms: no Go type, parser or nil error leaks into
// it, lists name every choice, and a near miss is suggested.
func TestMessagesSayWhatIsWrong(t *testing.T) {
	dir := t.TempDir()
	array := writeFile(t, dir, "array.json", "[1, 2]\n")
	for _, c := range []struct {
		args      []string
		want      []string
		forbidden []string
	}{
		{[]string{"bench", "load", dir}, []string{"not a safetensors checkpoint: a directory with no model.safetensors.index.json"}, []string{"<nil>"}},
		{[]string{"report", array}, []string{`the top level is a JSON array; a report is an object with "meta" and "results"`}, []string{"Go value", "struct"}},
		{[]string{"bench", "blocks", "--blocks", "1e9"}, []string{`--blocks "1e9": want a whole number`}, []string{"strconv"}},
		{[]string{"bench", "all", "--budget", "soon", "--out", dir}, []string{`--budget "soon": want a duration`}, []string{"time:"}},
		{[]string{"bench", "all", "-t", "bogus", "--out", dir}, []string{"matrix, load, imagepipeline, or all"}, []string{"), load"}},
		{[]string{"bench", "--baseline", "all"}, []string{`"all": a baseline is one name`}, nil},
		{[]string{"bench", "--baseline", "bogus"}, []string{"want one of pageable"}, []string{"or all"}},
		{[]string{"report"}, []string{"name a result file"}, []string{"(got 0)", "file(s)"}},
		{[]string{"benchh"}, []string{`unknown command "benchh" for "pinmem" (did you mean bench?)`}, nil},
		{[]string{"compare", fixture("bw.json"), fixture("bw.json"), "--threshold", "5"}, []string{"for 5 percent write 5%"}, nil},
		{[]string{"report", fixture("bw.json"), "-o", filepath.Join(dir, "r.yaml")}, []string{"unknown extension .yaml"}, nil},
		{[]string{"report", fixture("bw.json"), "-o", filepath.Join(dir, "noext")}, []string{"no extension to say the format"}, nil},
	} {
		stdout, stderr, code := cli(t, c.args...)
		if code != exitUsage || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want one line and %d", c.args, code, stdout, stderr, exitUsage)
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: %q lacks %q", c.args, stderr, w)
			}
		}
		for _, f := range c.forbidden {
			if strings.Contains(stderr, f) {
				t.Errorf("%v: %q shows %q", c.args, stderr, f)
			}
		}
	}
	for _, f := range []string{"r.yaml", "noext"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("%s was written", f)
		}
	}
}

// TestOutputPaths: -o FILE without an extension is written with an
// explicit --format, and -o /dev/null discards the report.
func TestOutputPaths(t *testing.T) {
	noext := filepath.Join(t.TempDir(), "noext")
	if _, stderr, code := cli(t, "report", fixture("bw.json"), "-o", noext, "--format", "json"); code != exitOK {
		t.Fatalf("-o noext --format json: exit %d, %s", code, stderr)
	}
	readReport(t, noext)
	if stdout, stderr, code := cli(t, "report", fixture("bw.json"), "-o", os.DevNull); code != exitOK || stdout != "" {
		t.Errorf("-o /dev/null: exit %d, %q %q", code, stdout, stderr)
	}
	if fi, err := os.Stat(os.DevNull); err != nil || fi.Mode().IsRegular() {
		t.Fatalf("%s was replaced: %v", os.DevNull, err)
	}
}

// TestDoctorMessages: doctor says the budget error once, every size one
// way ("2 GiB", not "2GiB" beside "11.8 GiB"), RLIMIT_MEMLOCK as a size,
// a directory as a directory, lists bench all and bench load, and writes
// "devices": [] where there is no GPU.
func TestDoctorMessages(t *testing.T) {
	t.Setenv(pinmem.EnvBudget, "bogus")
	stdout, _, _ := cli(t, "doctor")
	if strings.Contains(stdout, "budget: budget:") {
		t.Errorf("doctor doubles budget:\n%s", stdout)
	}
	t.Setenv(pinmem.EnvBudget, "2G")
	stdout, _, _ = cli(t, "doctor")
	if regexp.MustCompile(`\d(KiB|MiB|GiB|TiB)`).MatchString(stdout) {
		t.Errorf("doctor spells sizes two ways:\n%s", stdout)
	}
	if m := regexp.MustCompile(`(?m)^RLIMIT_MEMLOCK +(.*) \(`).FindStringSubmatch(stdout); m == nil || regexp.MustCompile(`^\d+$`).MatchString(m[1]) {
		t.Errorf("RLIMIT_MEMLOCK in raw bytes: %v", m)
	}
	for _, want := range []string{"  bench all ", "  bench load "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("commands omit %q:\n%s", want, stdout)
		}
	}
	stdout, _, _ = cli(t, "doctor", "--format", "json")
	var r struct {
		Devices json.RawMessage `json:"devices"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil || !strings.HasPrefix(string(r.Devices), "[") {
		t.Errorf(`doctor JSON "devices": %s, %v; want a list`, r.Devices, err)
	}
	// With a fake driver and no device, --strict exits 3 as a command
	// that needs a GPU does.
	testutil.UseFake(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{}})
	t.Setenv(pinmem.EnvBudget, "")
	if _, stderr, code := cli(t, "doctor", "--strict"); code != exitNoGPU {
		t.Errorf("doctor --strict without a device: exit %d, %q; want %d", code, stderr, exitNoGPU)
	}
}

// TestBenchHelpKindsListed: every kind the bench help's examples use is
// one the --kinds flag lists.
func TestBenchHelpKindsListed(t *testing.T) {
	stdout, _, code := cli(t, "bench", "--help")
	if code != exitOK {
		t.Fatalf("bench --help: exit %d", code)
	}
	usage := regexp.MustCompile(`--kinds string +(.*)`).FindStringSubmatch(stdout)
	if usage == nil {
		t.Fatalf("no --kinds in:\n%s", stdout)
	}
	listed := regexp.MustCompile(`[a-z][a-z-]*`).FindAllString(usage[1], -1)
	for _, m := range regexp.MustCompile(`(?m)^ +pinmem bench .*--kinds ([a-z,-]+)`).FindAllStringSubmatch(stdout, -1) {
		for _, k := range strings.Split(m[1], ",") {
			if !slices.Contains(listed, k) {
				t.Errorf("the help uses kind %q, which --kinds does not list (%s)", k, usage[1])
			}
		}
	}
}
