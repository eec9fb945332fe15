package testutil

import (
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
)

// UseFake installs a new fake driver as the process's driver (cudadrv.Get
// returns it) until t ends, then closes it. A second install while one is
// active fails t: tests that use a fake must not run in parallel with each
// other or with tests that use another driver. As on a GPU, code under test
// must make a context current on a locked OS thread before the calls that
// need one.
func UseFake(t testing.TB, opts fakedrv.Options) *fakedrv.Driver {
	t.Helper()
	d := fakedrv.New(opts)
	restore, err := fakedrv.Install(d, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		restore()
		_ = d.Close()
	})
	return d
}
