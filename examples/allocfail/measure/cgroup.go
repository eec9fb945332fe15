package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// envCgroupChild, set to a cgroup directory, makes the program the child of
// case 4: it joins that cgroup and pins more than its limit.
const envCgroupChild = "PINMEM_ALLOCFAIL_CGROUP"

// cgroupCase creates a cgroup v2 below the process's own, limits its memory,
// and runs a child process that joins it and pins four times the limit. The
// outcome (an error returned, the child killed, or the pin granted) is
// reported as it is: it depends on the kernel, the driver and the cgroup
// setup, so no outcome is an error of this program.
func cgroupCase(ctx context.Context, w io.Writer, limit int64) (o Outcome, err error) {
	dir, why := newCgroup(limit)
	if why != "" {
		o.Why = why
		fmt.Fprintf(w, "   not run: %s\n", why)
		return o, nil
	}
	defer func() {
		// The kernel may take a moment to let go of an exited process's
		// cgroup (EBUSY): try for a second.
		var rerr error
		for range 20 {
			if rerr = os.Remove(dir); rerr == nil || errors.Is(rerr, fs.ErrNotExist) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		err = errors.Join(err, fmt.Errorf("removing the cgroup %s: %w", dir, rerr))
	}()
	self, err := os.Executable()
	if err != nil {
		return o, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), envCgroupChild+"="+dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	o.Ran = true
	line := strings.TrimSpace(out.String())
	var exit *exec.ExitError
	switch {
	case runErr == nil:
		o.Note = line
	case errors.As(runErr, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			o.Note = fmt.Sprintf("the child was killed by %v", ws.Signal())
			if n := oomKills(dir); n > 0 {
				o.Note += fmt.Sprintf(" (memory.events: oom_kill %d)", n)
			}
		} else {
			o.Note = fmt.Sprintf("the child exited with status %d: %s", exit.ExitCode(), line)
		}
	default:
		return o, runErr
	}
	fmt.Fprintf(w, "   a child in a cgroup with memory.max %d MiB pinned %d MiB with cuMemHostAlloc: %s\n", limit>>20, 4*limit>>20, o.Note)
	fmt.Fprintln(w, "   handled: a refusal is an error to check like the others; a kill cannot be handled in the process: keep pins well under the cgroup's limit (pinmem's default budget is half of it)")
	return o, nil
}

// newCgroup makes a child cgroup of the process's own with memory.max set
// to limit (and no swap), returning its directory, or the reason it cannot.
// Only cgroup v2 is used: the process's cgroup is the "0::" line of
// /proc/self/cgroup, below the mount point of the cgroup2 filesystem.
func newCgroup(limit int64) (dir, why string) {
	mount := cgroup2Mount()
	if mount == "" {
		return "", "no cgroup v2 filesystem is mounted"
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", "cannot read /proc/self/cgroup: " + err.Error()
	}
	var path string
	for _, line := range strings.Split(string(self), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			path = p
		}
	}
	if path == "" {
		return "", "the process is in no cgroup v2"
	}
	parent := filepath.Join(mount, path)
	ctl, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
	if err != nil {
		return "", "no cgroup v2 at " + parent
	}
	if !slices.Contains(strings.Fields(string(ctl)), "memory") {
		return "", "the memory controller is not enabled for child cgroups of " + parent + " (cgroup.subtree_control)"
	}
	dir = filepath.Join(parent, fmt.Sprintf("pinmem-allocfail-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", "cannot create a cgroup: " + err.Error()
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.max"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		os.Remove(dir)
		return "", "cannot set memory.max: " + err.Error()
	}
	_ = os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0o644) // absent without swap accounting
	return dir, ""
}

// cgroup2Mount returns where the cgroup2 filesystem is mounted, or "".
func cgroup2Mount() string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		// "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0"
		if f := strings.Fields(line); len(f) >= 3 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	return ""
}

// oomKills returns memory.events' oom_kill count of a cgroup.
func oomKills(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "memory.events"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// cgroupChild is the child of case 4: it opens the GPU first (so that the
// driver's own memory is charged where the process started), then joins the
// cgroup in dir and pins four times its memory.max with cuMemHostAlloc. It
// prints one line and returns the exit status.
func cgroupChild(dir string, w io.Writer) int {
	dev, err := cuda.GetDevice(0)
	if err == nil {
		_, err = dev.PrimaryContext()
	}
	if err != nil {
		fmt.Fprintln(w, "cannot open the GPU:", err)
		return 3
	}
	b, err := os.ReadFile(filepath.Join(dir, "memory.max"))
	if err != nil {
		fmt.Fprintln(w, "cannot read memory.max:", err)
		return 3
	}
	limit, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		fmt.Fprintln(w, "memory.max is not a number:", err)
		return 3
	}
	// Writing 0 to cgroup.procs moves the writing process.
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("0"), 0o644); err != nil {
		fmt.Fprintln(w, "cannot join the cgroup:", err)
		return 3
	}
	pinmem.SetBudget(math.MaxInt64) // the cgroup, not the budget, is under test
	buf, err := pinmem.Alloc(int(4*limit), 0, pinmem.WithMethod(pinmem.MethodHostAlloc))
	if err != nil {
		fmt.Fprintf(w, "refused with %s: %v\n", errKind(err), strings.ReplaceAll(err.Error(), "\n", "; "))
		return 0
	}
	touchPages(buf.Bytes())
	fmt.Fprintf(w, "granted: %d bytes pinned beyond the cgroup's %d-byte limit\n", buf.Len(), limit)
	if err := buf.Free(); err != nil {
		fmt.Fprintln(w, "free:", err)
		return 3
	}
	return 0
}

// touchPages writes one byte per 4 KiB page.
func touchPages(b []byte) {
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
}
