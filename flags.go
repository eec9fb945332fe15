package pinmem

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/enumtext"
	"github.com/pinmem/pinmem/internal/pinopt"
)

// Flags select how memory is pinned. The zero value is plain pinned memory
// (cudaHostAllocDefault).
type Flags uint32

// Pinning flags. Portable, Mapped and WriteCombined are cuMemHostAlloc's
// flags; Portable, Mapped and ReadOnly are cuMemHostRegister's.
const (
	Portable      Flags = 1 << 0 // pinned for every CUDA context
	Mapped        Flags = 1 << 1 // mapped into the device address space (zero-copy); DevicePtr works
	WriteCombined Flags = 1 << 2 // write-combined: fast host writes/DMA, very slow host reads; cuMemHostAlloc only
	ReadOnly      Flags = 1 << 3 // registration only: device may only read (where supported)

	allFlags = Portable | Mapped | WriteCombined | ReadOnly
)

// numFlagCombinations is the number of distinct Flags values (every
// combination of the four flags).
const numFlagCombinations = int(allFlags) + 1

var flagNames = []struct {
	f    Flags
	name string
}{{Portable, "portable"}, {Mapped, "mapped"}, {WriteCombined, "writecombined"}, {ReadOnly, "readonly"}}

// String returns the flags joined by "|", e.g. "portable|mapped", or "default".
func (f Flags) String() string {
	if f == 0 {
		return "default"
	}
	var parts []string
	for _, n := range flagNames {
		if f&n.f != 0 {
			parts = append(parts, n.name)
			f &^= n.f
		}
	}
	if f != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint32(f)))
	}
	return strings.Join(parts, "|")
}

// MarshalText encodes the flags as String does (for JSON map keys); bits
// that are no flag are an error matching cuda.ErrInvalidValue.
func (f Flags) MarshalText() ([]byte, error) {
	if f&^allFlags != 0 {
		return nil, fmt.Errorf("pinmem: Flags %s has unknown bits: %w", f, cuda.ErrInvalidValue)
	}
	return []byte(f.String()), nil
}

// UnmarshalText parses the form MarshalText writes (see String), flag
// names in any order and case, so that LedgerStats round-trips through
// JSON and flags can be set from configuration; an unknown name is a
// *NameError.
func (f *Flags) UnmarshalText(b []byte) error {
	v, err := parseFlags(string(b))
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// parseFlags parses the form String returns: "default" (or the empty
// string) for no flag, otherwise flag names joined by "|" ("portable",
// "mapped", "writecombined", "readonly"), in any order. Names are matched
// without regard to case and surrounding spaces; an empty name (as in
// "mapped|") is an error.
func parseFlags(s string) (Flags, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.EqualFold(s, "default") {
		return 0, nil
	}
	names := make([]string, len(flagNames))
	for i, n := range flagNames {
		names[i] = n.name
	}
	var f Flags
	for _, p := range strings.Split(s, "|") {
		i := enumtext.Index(names, p)
		if i < 0 {
			return 0, &NameError{Type: "pinmem.Flags", Name: p, Known: names}
		}
		f |= flagNames[i].f
	}
	return f, nil
}

func (f Flags) hostAllocFlags() uint32 {
	var r uint32
	if f&Portable != 0 {
		r |= cudadrv.MemHostAllocPortable
	}
	if f&Mapped != 0 {
		r |= cudadrv.MemHostAllocDeviceMap
	}
	if f&WriteCombined != 0 {
		r |= cudadrv.MemHostAllocWriteCombined
	}
	return r
}

func (f Flags) registerFlags() uint32 {
	var r uint32
	if f&Portable != 0 {
		r |= cudadrv.MemHostRegisterPortable
	}
	if f&Mapped != 0 {
		r |= cudadrv.MemHostRegisterDeviceMap
	}
	if f&ReadOnly != 0 {
		r |= cudadrv.MemHostRegisterReadOnly
	}
	return r
}

// Kind says where a buffer's memory came from.
type Kind uint8

// Kinds of buffers.
const (
	KindHostAlloc    Kind = iota // cuMemHostAlloc
	KindMmapRegister             // pinmem's own mmap + cuMemHostRegister
	KindGoRegister               // the caller's Go slice + cuMemHostRegister
	numKinds
)

// NumKinds is the number of Kind values.
const NumKinds = int(numKinds)

var kindNames = [...]string{"hostalloc", "mmap-register", "go-register"}

// String returns "hostalloc", "mmap-register" or "go-register".
func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// MarshalText encodes the kind as String does (for JSON map keys).
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText parses the names String returns.
func (k *Kind) UnmarshalText(b []byte) error {
	i := enumtext.Index(kindNames[:], string(b))
	if i < 0 {
		return &NameError{Type: "pinmem.Kind", Name: string(b), Known: kindNames[:]}
	}
	*k = Kind(i)
	return nil
}

// Method chooses how Alloc obtains pinned memory.
type Method uint8

// Allocation methods.
const (
	// MethodAuto picks by size, flags and device: cuMemHostAlloc for small
	// buffers, write-combined memory and integrated GPUs; mmap +
	// cuMemHostRegister for buffers of at least AutoMmapThreshold bytes and
	// for ReadOnly.
	MethodAuto Method = iota
	// MethodHostAlloc always uses cuMemHostAlloc.
	MethodHostAlloc
	// MethodMmapRegister maps anonymous memory, faults it in in parallel
	// and registers it with cuMemHostRegister.
	MethodMmapRegister
)

var methodNames = []string{"auto", "hostalloc", "mmap-register"}

// String returns "auto", "hostalloc" or "mmap-register".
func (m Method) String() string {
	if int(m) < len(methodNames) {
		return methodNames[m]
	}
	return fmt.Sprintf("method(%d)", uint8(m))
}

// MarshalText encodes the method as String does; a value that is no
// method is an error matching cuda.ErrInvalidValue.
func (m Method) MarshalText() ([]byte, error) {
	if int(m) >= len(methodNames) {
		return nil, fmt.Errorf("pinmem: %s is no Method: %w", m, cuda.ErrInvalidValue)
	}
	return []byte(m.String()), nil
}

// UnmarshalText parses a name String returns, without regard to case; an
// unknown name is a *NameError.
func (m *Method) UnmarshalText(b []byte) error {
	i := enumtext.Index(methodNames, string(b))
	if i < 0 {
		return &NameError{Type: "pinmem.Method", Name: string(b), Known: methodNames}
	}
	*m = Method(i)
	return nil
}

// AutoMmapThreshold is the size from which MethodAuto maps and registers
// memory itself instead of calling cuMemHostAlloc. Mapping and registering
// is faster than cuMemHostAlloc at every size (cuMemHostAlloc has a fixed
// cost of about a millisecond; BenchmarkPinThreshold compares the two), but
// below this size every buffer would be a mapping (a VMA) and a
// registration of its own, and small buffers belong in a pool's slabs.
// Mappings under 2 MiB are rounded to the page, not to a huge page.
const AutoMmapThreshold = 256 << 10

// options are Alloc's and Register's settings, as the options set them.
type options = pinopt.Options

// Option sets an option of Alloc or Register. Options only record their
// values: Alloc and Register check them before anything else and return an
// *OptionError, which matches cuda.ErrInvalidValue, naming an option with
// a bad value (or a nil option).
type Option func(*pinopt.Options)

// WithDevice pins the memory for device d (its primary context). The
// default is device 0; a nil d is an error.
func WithDevice(d *cuda.Device) Option { return func(o *options) { o.Dev, o.DevSet = d, true } }

// WithMethod chooses how Alloc obtains the memory (default MethodAuto); a
// Method other than the constants is an error. Register ignores the
// method but refuses an unknown one as Alloc does.
func WithMethod(m Method) Option { return func(o *options) { o.Method = uint8(m) } }

// WithHugePages turns transparent huge pages for pinmem's own mappings on
// or off. The default is on when the kernel offers them (THP mode
// "madvise" or "always"); off asks the kernel not to use them
// (MADV_NOHUGEPAGE).
func WithHugePages(on bool) Option { return func(o *options) { o.Huge = &on } }

// WithThreads sets how many goroutines fault in the pages of a mapping
// before it is registered: 1 to 65536. The default is runtime.NumCPU().
func WithThreads(n int) Option { return func(o *options) { o.Threads, o.ThrSet = n, true } }

// buildOptions applies opts for fn ("pinmem.Alloc" or "pinmem.Register")
// and validates them (internal/pinopt, as pool.New does), returning an
// *OptionError for the first one refused.
func buildOptions(fn string, opts []Option) (options, error) {
	o, r := pinopt.Build(opts)
	if r != nil {
		return options{}, &OptionError{Func: fn, Option: r.Option, Value: r.Value, Reason: r.Reason}
	}
	if !o.ThrSet {
		o.Threads = runtime.NumCPU()
	}
	return o, nil
}
