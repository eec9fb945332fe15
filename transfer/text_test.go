package transfer_test

import (
	"errors"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/transfer"
)

func TestWaitModeText(t *testing.T) {
	err := testutil.CheckText(t, []transfer.WaitMode{transfer.WaitHybrid, transfer.WaitSleep, transfer.WaitPoll}, transfer.WaitMode(9), "spin")
	var ne *pinmem.NameError
	if !errors.As(err, &ne) || ne.Type != "transfer.WaitMode" || ne.Name != "spin" {
		t.Errorf("error %v: want a *pinmem.NameError for transfer.WaitMode", err)
	}
}
