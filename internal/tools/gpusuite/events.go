package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// event is one line of `go tool test2json` output (cmd/test2json's
// TestEvent).
type event struct {
	Action  string  // start, run, pause, cont, pass, bench, fail, output, skip
	Test    string  // empty for the package's own events
	Elapsed float64 // seconds, on pass, fail and skip
	Output  string  // on output
}

// result is what one test binary's events add up to.
type result struct {
	Pass, Fail, Skip int
	// Package is the binary's final action: "pass", "fail", or "" when the
	// output ended without one (a crash, a kill).
	Package string
	// Skips and Failures are "Test: reason" with the test's last message.
	Skips, Failures []string
	// Features are the text after "FEATURE SKIPS: " of every such line.
	Features []string
	// Text is the whole output, as -test.v would have printed it.
	Text string
}

// message matches a test's log line, "    file_test.go:12: text".
var message = regexp.MustCompile(`^\s+[^\s:]+\.go:\d+: (.*)$`)

// parseEvents reads test2json events from r, writes every output line to
// echo as it comes (the log shows what -test.v prints), and adds them up.
// A line that is not JSON is kept as output.
func parseEvents(r io.Reader, echo io.Writer) (result, error) {
	var res result
	var text strings.Builder
	last := map[string]string{} // test -> its last log message
	type end struct{ test, action string }
	var ends []end
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Action == "" {
			ev = event{Action: "output", Output: sc.Text() + "\n"}
		}
		switch ev.Action {
		case "output":
			text.WriteString(ev.Output)
			if echo != nil {
				_, _ = io.WriteString(echo, ev.Output)
			}
			line := strings.TrimRight(ev.Output, "\n")
			if m := message.FindStringSubmatch(line); m != nil && ev.Test != "" {
				last[ev.Test] = m[1]
			}
			if f, ok := strings.CutPrefix(line, "FEATURE SKIPS: "); ok {
				res.Features = append(res.Features, f)
			}
		case "pass", "fail", "skip":
			if ev.Test == "" {
				res.Package = ev.Action
				continue
			}
			ends = append(ends, end{ev.Test, ev.Action})
		}
	}
	// Messages may come after the test's end line (a skipped test's reason
	// does when it is logged at the end), so reasons are looked up last.
	for _, e := range ends {
		why := last[e.test]
		switch e.action {
		case "pass":
			res.Pass++
		case "fail":
			res.Fail++
			if why != "" {
				res.Failures = append(res.Failures, e.test+": "+why)
			} else {
				res.Failures = append(res.Failures, e.test)
			}
		case "skip":
			res.Skip++
			if why == "" {
				why = "(no reason printed)"
			}
			res.Skips = append(res.Skips, e.test+": "+why)
		}
	}
	res.Text = text.String()
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("reading test2json output: %w", err)
	}
	return res, nil
}
