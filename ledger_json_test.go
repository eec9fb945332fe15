package pinmem

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// LedgerStats, with its Kind and Flags map keys, survives a JSON round trip.
func TestLedgerStatsJSONRoundTrip(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	a, err := Alloc(64<<10, Portable|Mapped)
	if err != nil {
		t.Fatal(err)
	}
	defer mustFree(t, a)
	st := Stats()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var back LedgerStats
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	if !reflect.DeepEqual(back.ByKind, st.ByKind) || !reflect.DeepEqual(back.ByFlags, st.ByFlags) || back.Pinned != st.Pinned {
		t.Errorf("round trip changed the ledger:\n%+v\n%+v", st, back)
	}
	var k Kind
	if err := k.UnmarshalText([]byte("bogus")); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Kind.UnmarshalText(bogus) = %v", err)
	}
	for _, bad := range []string{"mapped|", "|||", "mapped||portable", "bogus"} {
		if _, err := parseFlags(bad); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("parseFlags(%q) = %v, want ErrInvalidValue", bad, err)
		}
	}
}
