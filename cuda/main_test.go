package cuda_test

import (
	"testing"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }
