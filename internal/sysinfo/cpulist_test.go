package sysinfo

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// hugeCPULists are lists whose ranges a naive parser expands without
// bound: a range length that overflows int, and many ranges that each
// stay under a per-range cap.
var hugeCPULists = []string{
	"0-9223372036854775807",
	"9223372036854775806-9223372036854775807",
	"1-9223372036854775807",
	"0-4294967296",
	strings.Repeat("0-65535,", 200) + "0",
	"65537",
	"99999999999999999999",
}

const childEnv = "SYSINFO_CPULIST_CHILD"

// TestParseCPUListHugeRanges is the regression test for an overflow: the
// range length of "0-9223372036854775807" wrapped negative, slipped past
// the entry cap, and the parser appended CPUs until memory ran out. Each
// input must fail fast with ErrRange or ErrSyntax. The inputs run in a
// child process that the test kills when it outgrows 256 MiB or runs for
// 20 s, so a regression fails the test instead of exhausting the machine.
func TestParseCPUListHugeRanges(t *testing.T) {
	if os.Getenv(childEnv) == "1" {
		for _, in := range hugeCPULists {
			start := time.Now()
			got, err := ParseCPUList(in)
			if err == nil || !(errors.Is(err, ErrRange) || errors.Is(err, ErrSyntax)) {
				fmt.Printf("FAIL %.40q: %d CPUs, error %v (want ErrRange or ErrSyntax)\n", in, len(got), err)
			} else if d := time.Since(start); d > time.Second {
				fmt.Printf("FAIL %.40q: took %v\n", in, d)
			}
		}
		fmt.Println("DONE")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestParseCPUListHugeRanges$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	const maxRSS = 256 << 20
	deadline := time.After(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			s := out.String()
			if err != nil || !strings.Contains(s, "DONE") || strings.Contains(s, "FAIL ") {
				t.Fatalf("child: %v\n%s", err, s)
			}
			return
		case <-deadline:
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("ParseCPUList still running after 20 s: killed\n%s", out.String())
		case <-tick.C:
			if rss := childRSS(cmd.Process.Pid); rss > maxRSS {
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("ParseCPUList grew the process to %d MiB: killed\n%s", rss>>20, out.String())
			}
		}
	}
}

// childRSS returns the resident size of process pid from /proc, or 0 where
// that is unknown (the deadline still bounds the child there).
func childRSS(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	f, err := parseKeyValueFile("status", b)
	if err != nil {
		return 0
	}
	return f["VmRSS"]
}

func TestParseCPUListBounds(t *testing.T) {
	top := strconv.Itoa(MaxCPUIndex)
	got, err := ParseCPUList("0-" + top)
	if err != nil || len(got) != MaxCPUIndex+1 || got[MaxCPUIndex] != MaxCPUIndex {
		t.Fatalf("ParseCPUList(0-%s) = %d CPUs, %v; want %d", top, len(got), err, MaxCPUIndex+1)
	}
	for in, want := range map[string]error{
		strconv.Itoa(MaxCPUIndex + 1):          ErrRange,
		"0-" + strconv.Itoa(MaxCPUIndex+1):     ErrRange,
		"3-1":                                  ErrSyntax,
		"1,1":                                  ErrSyntax,
		"0-3,2":                                ErrSyntax,
		"0-3,3-5":                              ErrSyntax,
		"-1":                                   ErrSyntax,
		"1-":                                   ErrSyntax,
		"1,,2":                                 ErrSyntax,
		"+1":                                   ErrSyntax,
		"0x1":                                  ErrSyntax,
		"1 - 2":                                ErrSyntax,
		"0-1-2":                                ErrSyntax,
		strings.Repeat("1", 30):                ErrRange,
		"0-" + strings.Repeat("9", 30):         ErrRange,
		"0-" + top + "," + strconv.Itoa(1<<17): ErrRange,
	} {
		got, err := ParseCPUList(in)
		if !errors.Is(err, want) || got != nil {
			t.Errorf("ParseCPUList(%q) = %v, %v; want nil and %v", in, got, err, want)
		}
	}
}
