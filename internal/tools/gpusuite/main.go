//go:build unix

// Command gpusuite runs one tier of pinmem's GPU suite on a machine with a
// GPU and no Go: the test binaries that `scripts/gpu-suite build` put in
// .gpu/bin, each with -test.v=test2json and its output read through the
// test2json binary built beside them, then the CLI's doctor and, in the
// full tier, the C reference programs. It prints every binary's output as
// -test.v does, then a summary: one row per binary (passed, failed,
// skipped, seconds), the skips with their reasons, the feature skips, the
// failures, and a last line "N passed, M failed, K skipped". It exits 1
// when anything failed, 2 on a usage error.
//
// .gpu/run quick|full|sanitize runs it; the tiers are:
//
//	quick     every test binary, PINMEM_REQUIRE_GPU=1
//	full      quick + benchmarks + the C reference programs (cref/)
//	sanitize  the tests under compute-sanitizer memcheck, -test.short
//
// Under -test.short a GPU test leaves out what the sanitizer judges
// itself or distorts: speed, and calls made invalid on purpose to see the
// driver refuse them (memcheck reports those as its own findings); the
// quick and full tiers check them.
//
// A tier fits in PINMEM_SUITE_BUDGET seconds (default 560): each binary's
// -test.timeout is cut to the time left. PINMEM_SUITE_ONLY (binary names
// without .test, space-separated) runs only those binaries.
// PINMEM_BENCHTIME (default 200ms), NVCC, COMPUTE_SANITIZER and CUDA_HOME
// are honoured as by scripts/gpu-suite.
package main

import (
	"bufio"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	root := flag.String("root", ".", "repository root (the tests run in its package folders)")
	gpu := flag.String("gpu", "", "the .gpu folder (default ROOT/.gpu)")
	out := flag.String("out", "", "folder for the log and results (default $OUT, else GPU/out)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: gpusuite [-root DIR] [-gpu DIR] [-out DIR] quick|full|sanitize")
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	tier := flag.Arg(0)
	if tier != "quick" && tier != "full" && tier != "sanitize" {
		flag.Usage()
		os.Exit(2)
	}
	s := &suite{tier: tier, root: *root, gpu: *gpu, out: *out}
	if s.gpu == "" {
		s.gpu = filepath.Join(s.root, ".gpu")
	}
	if s.out == "" {
		s.out = os.Getenv("OUT")
	}
	if s.out == "" {
		s.out = filepath.Join(s.gpu, "out")
	}
	os.Exit(s.main())
}

// suite is one tier's run.
type suite struct {
	tier, root, gpu, out string
	w                    io.Writer // stdout and the tier's log
	start, deadline      time.Time
	tmp                  string
	bindir               string

	rows                     []string
	skips, features, fails   []string
	totPass, totFail, totSkp int
}

func (s *suite) printf(format string, args ...any) { fmt.Fprintf(s.w, format, args...) }

func (s *suite) row(name, res string, p, f, k int, secs string) {
	s.rows = append(s.rows, fmt.Sprintf("%-34s %-6s %6d %6d %6d %8s", name, res, p, f, k, secs))
	s.totPass += p
	s.totFail += f
	s.totSkp += k
}

func (s *suite) fail(name, why string, secs string) {
	s.row(name, "FAIL", 0, 1, 0, secs)
	s.fails = append(s.fails, name+": "+why)
}

func since(t time.Time) string { return fmt.Sprintf("%ds", int(time.Since(t).Seconds())) }

func (s *suite) main() int {
	if err := os.MkdirAll(s.out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "gpusuite:", err)
		return 2
	}
	logf, err := os.Create(filepath.Join(s.out, s.tier+".log"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpusuite:", err)
		return 2
	}
	defer logf.Close()
	s.w = io.MultiWriter(os.Stdout, logf)
	budget := 560
	if v := os.Getenv("PINMEM_SUITE_BUDGET"); v != "" {
		if budget, err = strconv.Atoi(v); err != nil || budget < 1 {
			fmt.Fprintf(os.Stderr, "gpusuite: PINMEM_SUITE_BUDGET=%q: want a number of seconds\n", v)
			return 2
		}
	}
	if s.tier == "full" {
		_ = os.WriteFile(filepath.Join(s.out, "bench.txt"), nil, 0o644)
	}
	s.start = time.Now()
	s.deadline = s.start.Add(time.Duration(budget) * time.Second)
	os.Setenv("PINMEM_REQUIRE_GPU", "1")
	s.printf("=== pinmem GPU suite: tier %s, %s, budget %ds\n", s.tier, s.start.UTC().Format(time.RFC3339), budget)
	if b, err := os.ReadFile(filepath.Join(s.gpu, "BUILDINFO")); err == nil {
		for l := range strings.Lines(string(b)) {
			s.printf("    %s", l)
		}
	}
	if smi, err := exec.LookPath("nvidia-smi"); err == nil {
		o, _ := exec.Command(smi, "--query-gpu=name,driver_version,pci.bus_id,memory.total", "--format=csv,noheader").CombinedOutput()
		for l := range strings.Lines(string(o)) {
			s.printf("    gpu: %s", l)
		}
	} else {
		s.printf("    nvidia-smi not found\n")
	}
	manifest, err := os.ReadFile(filepath.Join(s.gpu, "manifest"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "no %s/manifest: run scripts/gpu-suite build on a machine with Go first\n", s.gpu)
		return 2
	}
	if s.tmp, err = os.MkdirTemp("", "gpusuite"); err != nil {
		fmt.Fprintln(os.Stderr, "gpusuite:", err)
		return 2
	}
	defer os.RemoveAll(s.tmp)
	if s.bindir, err = s.unpack(); err != nil {
		fmt.Fprintln(os.Stderr, "gpusuite:", err)
		return 2
	}
	if s.tier == "full" {
		s.prebuildCref()
	}
	s.checkKernels()
	s.runBinaries(string(manifest))
	if s.tier != "sanitize" {
		s.doctor()
	}
	if s.tier == "full" {
		s.runCref()
	}
	return s.summary()
}

// unpack returns the folder of runnable binaries: .gpu/bin, or a temporary
// copy with the gzipped ones unpacked.
func (s *suite) unpack() (string, error) {
	bin := filepath.Join(s.gpu, "bin")
	gz, _ := filepath.Glob(filepath.Join(bin, "*.gz"))
	if len(gz) == 0 {
		return bin, nil
	}
	dir := filepath.Join(s.tmp, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, p := range gz {
		if err := gunzip(p, filepath.Join(dir, strings.TrimSuffix(filepath.Base(p), ".gz"))); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func gunzip(src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	o, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(o, zr); err != nil {
		o.Close()
		return fmt.Errorf("%s: %w", src, err)
	}
	return o.Close()
}

// findTool returns override, the tool on PATH, or the tool in CUDA_HOME.
func findTool(name, override string) (string, bool) {
	if override != "" {
		return override, true
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, true
	}
	home := os.Getenv("CUDA_HOME")
	if home == "" {
		home = "/usr/local/cuda"
	}
	for _, c := range []string{filepath.Join(home, "bin", name), "/usr/local/cuda/bin/" + name} {
		if st, err := os.Stat(c); err == nil && st.Mode()&0o111 != 0 {
			return c, true
		}
	}
	return "", false
}

// prebuildCref builds the C reference programs before the Go benchmarks,
// which interleave their samples with them (BenchmarkCopyVsC, ...).
func (s *suite) prebuildCref() {
	dir := filepath.Join(s.tmp, "cref-pre")
	c := exec.Command(filepath.Join(s.root, "cref", "build"), "-o", dir)
	c.Dir = s.root
	c.Stderr = s.w
	if err := c.Run(); err != nil {
		s.printf("cref build failed: Go benchmarks run without their C reference\n")
		return
	}
	for env, prog := range map[string]string{"PINMEM_CREF_BW": "bw", "PINMEM_CREF_CALLCOST": "callcost",
		"PINMEM_CREF_OVERLAP": "overlap", "PINMEM_CREF_LOOPLIB": "libpinmemloop.so",
		"PINMEM_CREF_VECTORADD": "vectoradd", "PINMEM_CREF_IMAGEPIPELINE": "imagepipeline",
		"PINMEM_CREF_BLOCKS": "blocks"} {
		os.Setenv(env, filepath.Join(dir, prog))
	}
}

// checkKernels checks that the committed PTX is what nvcc makes of the
// committed source.
func (s *suite) checkKernels() {
	const name = "kernels (compile --check)"
	nvcc, ok := findTool("nvcc", os.Getenv("NVCC"))
	if !ok {
		s.printf("=== kernels: nvcc not found, PTX check skipped\n")
		s.row(name, "SKIP", 0, 0, 1, "-")
		s.skips = append(s.skips, name+": nvcc not found")
		return
	}
	s.printf("=== kernels: scripts/compile-kernels --check (%s)\n", nvcc)
	t0 := time.Now()
	c := exec.Command(filepath.Join(s.root, "scripts", "compile-kernels"), "--check")
	c.Dir, c.Stdout, c.Stderr = s.root, s.w, s.w
	c.Env = append(os.Environ(), "NVCC="+nvcc)
	if err := c.Run(); err != nil {
		s.fail(name, "internal/kernels/pinmem.ptx does not match nvcc's output for internal/kernels/pinmem.cu", since(t0))
		return
	}
	s.row(name, "PASS", 1, 0, 0, since(t0))
}

// only reports whether PINMEM_SUITE_ONLY lets binary name run.
func only(name string) bool {
	o := os.Getenv("PINMEM_SUITE_ONLY")
	if strings.TrimSpace(o) == "" {
		return true
	}
	for _, n := range strings.Fields(o) {
		if n == strings.TrimSuffix(name, ".test") {
			return true
		}
	}
	return false
}

func (s *suite) runBinaries(manifest string) {
	per, reserve := 150*time.Second, time.Duration(0)
	switch s.tier {
	case "full":
		per, reserve = 240*time.Second, 150*time.Second // cref runs last
	case "sanitize":
		per = 400 * time.Second
	}
	sanitizer := ""
	if s.tier == "sanitize" {
		var ok bool
		if sanitizer, ok = findTool("compute-sanitizer", os.Getenv("COMPUTE_SANITIZER")); !ok {
			fmt.Fprintln(os.Stderr, "compute-sanitizer not found (set COMPUTE_SANITIZER or CUDA_HOME)")
			s.fail("compute-sanitizer", "not found", "-")
			return
		}
	}
	t2j := filepath.Join(s.bindir, "test2json")
	for line := range strings.Lines(manifest) {
		name, dir, _ := strings.Cut(strings.TrimSpace(line), " ")
		if name == "" || !only(name) {
			continue
		}
		timeout := min(per, time.Until(s.deadline)-reserve-40*time.Second).Truncate(time.Second)
		if timeout < 20*time.Second {
			s.printf("=== %s: not run, the tier's time budget is spent\n", name)
			s.fail(name, "not run (time budget spent)", "-")
			continue
		}
		bin := filepath.Join(s.bindir, name)
		if _, err := os.Stat(bin); err != nil {
			s.fail(name, "binary missing", "-")
			continue
		}
		secs := int(timeout.Seconds())
		cmd := []string{bin, "-test.v=test2json", "-test.count=1", fmt.Sprintf("-test.timeout=%ds", secs)}
		switch s.tier {
		case "full":
			bt := os.Getenv("PINMEM_BENCHTIME")
			if bt == "" {
				bt = "200ms"
			}
			cmd = append(cmd, "-test.bench=.", "-test.benchtime="+bt)
		case "sanitize":
			cmd = append([]string{sanitizer, "--tool", "memcheck", "--leak-check", "full", "--report-api-errors", "no", "--error-exitcode", "99"},
				append(cmd, "-test.short", "-test.bench=^$")...)
		}
		s.printf("=== %s (in %s, timeout %ds): %s\n", name, dir, secs, strings.Join(cmd, " "))
		t0 := time.Now()
		rc, res, err := runTest(cmd, filepath.Join(s.root, dir), t2j, name, timeout+20*time.Second, s.w)
		if err != nil {
			s.fail(name, err.Error(), since(t0))
			continue
		}
		s.account(name, rc, res, since(t0), secs)
	}
}

// account adds one binary's outcome to the summary.
func (s *suite) account(name string, rc int, res result, secs string, timeout int) {
	for _, k := range res.Skips {
		s.skips = append(s.skips, name+": "+k)
	}
	for _, f := range res.Failures {
		s.fails = append(s.fails, name+": "+f)
	}
	for _, f := range res.Features {
		s.features = append(s.features, name+": "+f)
	}
	if i := strings.Index(res.Text, "ERROR SUMMARY: "); i >= 0 {
		if l, _, _ := strings.Cut(res.Text[i:], "\n"); !strings.HasPrefix(l, "ERROR SUMMARY: 0 ") {
			s.fails = append(s.fails, name+": "+l)
		}
	}
	// compute-sanitizer exits non-zero when the program never called CUDA
	// (packages whose tests are CPU-only): that is a pass when the tests
	// passed, not a sanitizer finding.
	if s.tier == "sanitize" && rc != 0 && res.Fail == 0 && res.Package == "pass" &&
		strings.Contains(res.Text, "terminated before first instrumented API call") {
		rc, secs = 0, secs+" (no CUDA calls)"
	}
	if rc == 0 && res.Package != "fail" {
		s.row(name, "PASS", res.Pass, res.Fail, res.Skip, secs)
	} else {
		if res.Fail == 0 {
			res.Fail = 1
			s.fails = append(s.fails, name+": "+failureWhy(rc, res.Text, timeout))
		}
		s.row(name, "FAIL", res.Pass, res.Fail, res.Skip, secs)
	}
	if s.tier == "full" {
		s.appendBenchLines(name, res.Text)
	}
}

// failureWhy says why a binary that exited with status rc and printed
// text failed when no test of it failed: the leak report of testutil.Main
// if it printed one, else a timeout, a kill, a sanitizer finding or the
// bare exit status (timeout is its -test.timeout in seconds).
func failureWhy(rc int, text string, timeout int) string {
	if i := strings.Index(text, "\nFAIL: leaked"); i >= 0 {
		why, _, _ := strings.Cut(text[i+1:], "\n")
		return why
	}
	switch {
	case strings.Contains(text, "panic: test timed out"):
		return fmt.Sprintf("test timed out after %ds", timeout)
	case rc == 124 || rc == 137:
		return fmt.Sprintf("killed after %ds+ (hung?)", timeout)
	case rc == 99:
		return "compute-sanitizer reported errors"
	}
	return fmt.Sprintf("exit status %d", rc)
}

// appendBenchLines appends the benchmark result lines of text to
// bench.txt in the output directory, each prefixed with the binary's
// name; the file is best effort, so an error opening it is ignored.
func (s *suite) appendBenchLines(name, text string) {
	f, err := os.OpenFile(filepath.Join(s.out, "bench.txt"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	for l := range strings.Lines(text) {
		if benchLine(l) {
			fmt.Fprintf(f, "%s: %s", name, l)
		}
	}
	f.Close()
}

// benchLine reports whether l is a benchmark result ("BenchmarkX-8  100  12 ns/op").
func benchLine(l string) bool {
	f := strings.Fields(l)
	if len(f) < 3 || !strings.HasPrefix(f[0], "Benchmark") {
		return false
	}
	_, err := strconv.Atoi(f[1])
	return err == nil
}

// runTest runs cmd in dir with its output read by test2json (-p name),
// echoing the output to w. It kills the process group after limit (SIGTERM,
// then SIGKILL 10 s later) and returns the exit status: 124 when killed,
// -1 when it could not be run.
func runTest(cmd []string, dir, test2json, name string, limit time.Duration, w io.Writer) (int, result, error) {
	// test2json's stderr and the event parser both write to w.
	w = &lockedWriter{w: w}
	pr, pw, err := os.Pipe()
	if err != nil {
		return -1, result{}, err
	}
	conv := exec.Command(test2json, "-p", strings.TrimSuffix(name, ".test"))
	conv.Stdin = pr
	convOut, err := conv.StdoutPipe()
	if err != nil {
		return -1, result{}, err
	}
	conv.Stderr = w
	if err := conv.Start(); err != nil {
		pr.Close()
		pw.Close()
		return -1, result{}, fmt.Errorf("starting test2json: %w", err)
	}
	pr.Close()
	c := exec.Command(cmd[0], cmd[1:]...)
	c.Dir, c.Stdout, c.Stderr = dir, pw, pw
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	startErr := c.Start()
	pw.Close()
	type parsed struct {
		res result
		err error
	}
	pc := make(chan parsed, 1)
	go func() {
		res, err := parseEvents(bufio.NewReader(convOut), w)
		_, _ = io.Copy(io.Discard, convOut)
		pc <- parsed{res, err}
	}()
	if startErr != nil {
		p := <-pc
		_ = conv.Wait()
		return -1, p.res, fmt.Errorf("starting %s: %w", cmd[0], startErr)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	killed := false
	var werr error
	select {
	case werr = <-done:
	case <-time.After(limit):
		killed = true
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGTERM)
		select {
		case werr = <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			werr = <-done
		}
	}
	p := <-pc
	_ = conv.Wait()
	rc := 0
	var ee *exec.ExitError
	switch {
	case killed:
		rc = 124
	case errors.As(werr, &ee):
		rc = ee.ExitCode()
		if rc < 0 {
			rc = 128 + int(ee.Sys().(syscall.WaitStatus).Signal())
		}
	case werr != nil:
		return -1, p.res, werr
	}
	return rc, p.res, p.err
}

// runPlain runs a command with a time limit, its output to w; the exit
// status is 124 when the limit killed it.
func runPlain(dir string, limit time.Duration, w io.Writer, args ...string) int {
	c := exec.Command(args[0], args[1:]...)
	c.Dir, c.Stdout, c.Stderr = dir, w, w
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		fmt.Fprintln(w, err)
		return -1
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return max(ee.ExitCode(), 1)
		}
		if err != nil {
			return -1
		}
		return 0
	case <-time.After(limit):
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		<-done
		return 124
	}
}

// doctor runs the CLI's own health check.
func (s *suite) doctor() {
	bin := filepath.Join(s.bindir, "pinmem")
	if _, err := os.Stat(bin); err != nil {
		return
	}
	s.printf("=== pinmem doctor\n")
	t0 := time.Now()
	if rc := runPlain(s.root, 60*time.Second, s.w, bin, "doctor"); rc != 0 {
		s.fail("pinmem doctor", fmt.Sprintf("exit status %d", rc), since(t0))
		return
	}
	s.row("pinmem doctor", "PASS", 1, 0, 0, since(t0))
}

// runCref builds the C reference programs and runs each, their JSON lines
// going to OUT/cref.jsonl.
func (s *suite) runCref() {
	jsonl, err := os.Create(filepath.Join(s.out, "cref.jsonl"))
	if err != nil {
		s.fail("cref", err.Error(), "-")
		return
	}
	defer jsonl.Close()
	s.printf("=== cref: build\n")
	t0 := time.Now()
	bin := filepath.Join(s.tmp, "cref-bin")
	if rc := runPlain(s.root, time.Until(s.deadline), s.w, filepath.Join(s.root, "cref", "build"), "-o", bin); rc != 0 {
		s.fail("cref build", "build failed (nvcc)", since(t0))
		return
	}
	ptx := filepath.Join(s.root, "internal", "kernels", "pinmem.ptx")
	progs := []struct {
		label string
		args  []string
	}{
		{"bw", []string{bin + "/bw", "--samples", "5"}},
		{"bw --pin-cost", []string{bin + "/bw", "--pin-cost", "--samples", "3"}},
		{"callcost", []string{bin + "/callcost", "--samples", "101", "--batch", "1000"}},
		{"overlap", []string{bin + "/overlap", ptx, "--runs", "5"}},
		{"overlap --no-spin", []string{bin + "/overlap", ptx, "--runs", "5", "--no-spin", "--no-baseline"}},
	}
	for _, p := range progs {
		label := "cref " + p.label
		left := time.Until(s.deadline) - 5*time.Second
		if left < 10*time.Second {
			s.fail(label, "not run (time budget spent)", "-")
			continue
		}
		s.printf("=== %s: %s\n", label, strings.Join(p.args, " "))
		t0 := time.Now()
		if rc := runPlain(s.root, left, io.MultiWriter(s.w, jsonl), p.args...); rc != 0 {
			s.fail(label, fmt.Sprintf("exit status %d", rc), since(t0))
			continue
		}
		s.row(label, "PASS", 1, 0, 0, since(t0))
	}
}

// summary prints the summary and returns the exit status.
func (s *suite) summary() int {
	s.printf("\n=== SUMMARY: tier %s, %s\n", s.tier, since(s.start))
	s.printf("%-34s %-6s %6s %6s %6s %8s\n", "BINARY", "RESULT", "PASS", "FAIL", "SKIP", "TIME")
	for _, r := range s.rows {
		s.printf("%s\n", r)
	}
	list := func(title, prefix string, items []string) {
		if len(items) > 0 {
			s.printf("%s\n", title)
			for _, it := range items {
				s.printf("  %s%s\n", prefix, it)
			}
		}
	}
	list("Skipped:", "", s.skips)
	list("Feature skips (the device lacks the feature):", "FEATURE SKIPS: ", s.features)
	list("Failures:", "", s.fails)
	if s.tier == "full" {
		s.printf("Results: %s (C reference), %s (Go benchmarks)\n", filepath.Join(s.out, "cref.jsonl"), filepath.Join(s.out, "bench.txt"))
	}
	s.printf("%d passed, %d failed, %d skipped\n", s.totPass, s.totFail, s.totSkp)
	if s.totFail > 0 || len(s.fails) > 0 {
		return 1
	}
	return 0
}

// lockedWriter serialises writes from several goroutines to one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
