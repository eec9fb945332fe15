package pagenode

import (
	"os"
	"runtime"
	"testing"

	"github.com/pinmem/pinmem/internal/hostptr"
)

// TestOf: touched pages of this process are on a node the host has (where
// it reports NUMA nodes), and an address nothing is mapped at is -1.
func TestOf(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("move_pages is Linux's")
	}
	b := make([]byte, 3<<20)
	for i := range b {
		b[i] = 1
	}
	a := hostptr.AddrOf(b)
	n := Of(a, a+uintptr(len(b))/2, a+uintptr(len(b))-1)
	if _, err := os.Stat("/sys/devices/system/node/node0"); err == nil {
		if n < 0 {
			t.Fatalf("touched pages: node %d", n)
		}
		if _, err := os.Stat("/sys/devices/system/node/node" + string(rune('0'+n))); err != nil {
			t.Fatalf("node %d: %v", n, err)
		}
	}
	if got := Of(4096); got != -1 {
		t.Fatalf("unmapped page: node %d, want -1", got)
	}
	if got := Of(); got != -1 {
		t.Fatalf("no address: %d", got)
	}
	runtime.KeepAlive(b)
}
