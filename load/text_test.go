package load_test

import (
	"errors"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/load"
)

func TestModeText(t *testing.T) {
	err := testutil.CheckText(t, []load.Mode{load.ModeAuto, load.ModeDirect, load.ModeBuffered, load.ModeMapped}, load.Mode(9), "odirect")
	var ne *pinmem.NameError
	if !errors.As(err, &ne) || ne.Type != "load.Mode" || ne.Name != "odirect" {
		t.Errorf("error %v: want a *pinmem.NameError for load.Mode", err)
	}
}
