package blocks_test

import (
	"errors"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/blocks"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestStrategyText(t *testing.T) {
	err := testutil.CheckText(t, []blocks.Strategy{blocks.Auto, blocks.DriverBatch, blocks.PerCopy, blocks.Kernel}, blocks.Strategy(9), "batch")
	var ne *pinmem.NameError
	if !errors.As(err, &ne) || ne.Type != "blocks.Strategy" || ne.Name != "batch" {
		t.Errorf("error %v: want a *pinmem.NameError for blocks.Strategy", err)
	}
}
