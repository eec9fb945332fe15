package bench

import (
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestConfigJSONNames: every field of the configurations that reports
// record (meta.config) has a snake_case JSON name, and a name that says
// its unit where the value has one: sizes (int64) end in _bytes,
// durations in _ns.
func TestConfigJSONNames(t *testing.T) {
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	dur := reflect.TypeFor[time.Duration]()
	for _, v := range []any{BandwidthConfig{}, ConcurrencyConfig{}, PinConfig{}, OverlapConfig{}, ZeroCopyConfig{}, BlocksConfig{}, MatrixConfig{}, SessionConfig{}, SuiteEnv{}} {
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if !snake.MatchString(name) {
				t.Errorf("%s.%s: JSON name %q is not snake_case", typ.Name(), f.Name, name)
				continue
			}
			switch {
			case f.Type == dur && !strings.HasSuffix(name, "_ns"):
				t.Errorf("%s.%s: a duration named %q, want a name ending in _ns", typ.Name(), f.Name, name)
			case (f.Type.Kind() == reflect.Int64 && f.Type != dur || f.Type == reflect.TypeFor[[]int64]()) && !strings.HasSuffix(name, "_bytes"):
				t.Errorf("%s.%s: a size named %q, want a name ending in _bytes", typ.Name(), f.Name, name)
			}
		}
	}
}
