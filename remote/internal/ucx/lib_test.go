package ucx

import (
	"errors"
	"os"
	"testing"
)

// TestLoadMissing: a library that is not there is a *LoadError matching
// ErrUnavailable, naming the path.
func TestLoadMissing(t *testing.T) {
	_, err := load("/nonexistent/libucp.so.0")
	var le *LoadError
	if !errors.As(err, &le) || !errors.Is(err, ErrUnavailable) || le.Path != "/nonexistent/libucp.so.0" {
		t.Fatalf("load of a missing library: %T %v", err, err)
	}
}

// TestOpen: where libucp is installed it loads, its version is one this
// binding's layouts fit, and UCX's error signal handlers were turned off
// (the Go runtime keeps SIGSEGV). Without the library the test skips,
// unless PINMEM_REQUIRE_UCX=1.
func TestOpen(t *testing.T) {
	l, err := Open()
	if errors.Is(err, ErrUnavailable) && os.Getenv("PINMEM_REQUIRE_UCX") != "1" {
		t.Skipf("UCX unavailable (PINMEM_REQUIRE_UCX=1 makes this a failure): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if l.Major != 1 || l.Minor < 13 {
		t.Fatalf("version %d.%d.%d", l.Major, l.Minor, l.Release)
	}
	if v, ok := os.LookupEnv("UCX_ERROR_SIGNALS"); !ok {
		t.Fatalf("UCX_ERROR_SIGNALS unset after Open (%q)", v)
	}
	if s := l.StatusString(ErrConnectionReset); s == "" {
		t.Fatal("no text for UCS_ERR_CONNECTION_RESET")
	}
	t.Logf("UCX %d.%d.%d from %s", l.Major, l.Minor, l.Release, l.Path)
}

// TestStatus: a status returned in a register is its low byte, signed
// (ucs_status_t is a packed enum), and peer failures are recognised.
func TestStatus(t *testing.T) {
	for r, want := range map[uintptr]Status{0: OK, 1: InProgress, 0xe7: ErrConnectionReset, 0xffffff00 | 0xb0: ErrEndpointTimeout, ^uintptr(0) - 5: ErrUnreachable} {
		if got := status(r); got != want {
			t.Errorf("status(%#x) = %d, want %d", r, got, want)
		}
	}
	for _, s := range []Status{ErrConnectionReset, ErrEndpointTimeout, ErrUnreachable, ErrFirstEndpointFail} {
		if !s.PeerFailure() {
			t.Errorf("%d is a peer failure", s)
		}
	}
	for _, s := range []Status{OK, ErrInvalidParam, ErrNoMemory} {
		if s.PeerFailure() {
			t.Errorf("%d is not a peer failure", s)
		}
	}
}
