package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSIGINTWhileReadingStdin: a SIGINT while report - waits on standard
// input (a pipe kept open) ends the wait at once: exit status 130, a line
// saying the input was not read further, not a measurement's interrupt.
func TestSIGINTWhileReadingStdin(t *testing.T) {
	if os.Getenv("PINMEM_STDIN_CHILD") != "" {
		go func() {
			for !readingStdin.Load() { // run's handler is in place by then
				time.Sleep(time.Millisecond)
			}
			fmt.Fprintln(os.Stderr, "child: reading")
		}()
		os.Exit(run([]string{"report", "-"}))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSIGINTWhileReadingStdin$")
	cmd.Env = append(os.Environ(), "PINMEM_STDIN_CHILD=1")
	stdin, err := cmd.StdinPipe() // kept open: the child waits on it
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	// Signal once the child waits on its input, its handler in place (a
	// signal before it would kill the child with no status of ours).
	sc := bufio.NewScanner(pr)
	var stderr strings.Builder
	for sc.Scan() && sc.Text() != "child: reading" {
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	read := make(chan struct{})
	go func() {
		defer close(read)
		for sc.Scan() {
			stderr.WriteString(sc.Text() + "\n")
		}
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("report - went on waiting on standard input after SIGINT")
	}
	<-read // the child's stderr, to its end
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("child: %v (%s), want exit status 130", err, stderr.String())
	}
	if s := stderr.String(); !strings.Contains(s, "no longer reading standard input") || !strings.Contains(s, "interrupted while reading standard input") ||
		strings.Contains(s, "after the current sample") {
		t.Errorf("stderr: %q", s)
	}
}
