package remote

import (
	"testing"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) {
	if peerMain() {
		return
	}
	testutil.Main(m)
}
