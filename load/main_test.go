package load

import (
	"testing"

	"github.com/pinmem/pinmem/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }
