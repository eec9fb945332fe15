package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestSecondSignalExitsAtOnce: a run whose sample never finishes (a hung
// GPU, here a fake one that blocks) ignores nothing: the first SIGINT asks
// it to stop after the current sample, the second exits at once with
// status 130 and writes no report.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	if os.Getenv("PINMEM_SIGNAL_CHILD") != "" {
		d := testutil.UseFake(t, fakedrv.Options{WaitTimeout: -1})
		d.SetHook(func(op string) cudadrv.Result {
			if op == "cuEventSynchronize" {
				fmt.Fprintln(os.Stderr, "child: in a sample")
				select {} // the sample never ends
			}
			return cudadrv.Success
		})
		os.Exit(run([]string{"bench", "--kinds", "pinned", "--sizes", "64KiB", "--quiet", "--format", "json", "-o", os.Getenv("PINMEM_SIGNAL_CHILD")}))
	}
	out := filepath.Join(t.TempDir(), "bw.json")
	cmd := exec.Command(os.Args[0], "-test.run=^TestSecondSignalExitsAtOnce$")
	cmd.Env = append(os.Environ(), "PINMEM_SIGNAL_CHILD="+out)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	waitFor := func(prefix string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("child ended before saying %q", prefix)
				}
				if strings.Contains(l, prefix) {
					return
				}
			case <-timeout:
				_ = cmd.Process.Kill()
				t.Fatalf("child never said %q", prefix)
			}
		}
	}
	waitFor("child: in a sample")
	_ = cmd.Process.Signal(syscall.SIGINT)
	waitFor("stopping after the current sample")
	start := time.Now()
	_ = cmd.Process.Signal(syscall.SIGINT)
	for range lines {
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("child: %v, want exit status 130", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("second SIGINT took %v to end the process", d)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a report was written after the second signal")
	}
}
