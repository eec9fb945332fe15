package testutil

import (
	"encoding"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cuda"
)

// CheckText checks an enum's text form: every value of values marshals to
// its String, and that text, also upper-cased and padded with spaces,
// unmarshals back to the value; invalid, a value that is none of them,
// fails to marshal with an error matching cuda.ErrInvalidValue; and the
// name bad fails to unmarshal with such an error, which CheckText returns
// for the caller to check its type.
func CheckText[T interface {
	comparable
	fmt.Stringer
	encoding.TextMarshaler
}, P interface {
	*T
	encoding.TextUnmarshaler
}](t *testing.T, values []T, invalid T, bad string) error {
	t.Helper()
	for _, v := range values {
		b, err := v.MarshalText()
		if err != nil || string(b) != v.String() {
			t.Errorf("%v.MarshalText() = %q, %v; want %q", v, b, err, v.String())
			continue
		}
		for _, text := range []string{string(b), " " + strings.ToUpper(string(b)) + " "} {
			var got T
			if err := P(&got).UnmarshalText([]byte(text)); err != nil || got != v {
				t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, got, err, v)
			}
		}
	}
	if b, err := invalid.MarshalText(); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("%v.MarshalText() = %q, %v; want an error matching cuda.ErrInvalidValue", invalid, b, err)
	}
	var got T
	err := P(&got).UnmarshalText([]byte(bad))
	if !errors.Is(err, cuda.ErrInvalidValue) || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
		t.Errorf("UnmarshalText(%q) = %v, %v; want an error naming it, matching cuda.ErrInvalidValue", bad, got, err)
	}
	return err
}
