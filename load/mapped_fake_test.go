package load

import (
	"context"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestFakeMappedReadsBuffered: a Loader asked for ModeMapped reads
// buffered into its stages, registers none of the file's pages, says why
// in Stats.Fallback, and delivers every byte.
func TestFakeMappedReadsBuffered(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 3<<20+777, 31)
	l := e.loader(t, WithMode(ModeMapped))
	dst := e.devbuf(t, len(data))
	regs := e.d.Calls("cuMemHostRegister_v2")
	st, err := l.LoadFile(context.Background(), path, dst)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != ModeBuffered || !strings.Contains(st.Fallback, "ModeMapped reads buffered") || st.ReadBytes < int64(len(data)) {
		t.Errorf("stats %+v, want a buffered load that says why", st)
	}
	if n := e.d.Calls("cuMemHostRegister_v2") - regs; n != 0 {
		t.Errorf("%d registrations during the load, want none", n)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
}
