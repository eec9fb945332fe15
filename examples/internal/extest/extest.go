// Package kerneltest checks, in the examples' tests, that an example's
// kernel.ptx is what nvcc made of the kernel.cu beside it.
//
// scripts/compile-kernels writes each kernel.ptx with a first line
//
//	// pinmem-source-sha256: <SHA-256 of kernel.cu>
//
// followed by nvcc's output. Until it has run on a machine with nvcc, an
// example keeps a placeholder kernel.ptx whose text says PLACEHOLDER and that
// defines no kernel.
package kerneltest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"

	"github.com/pinmem/pinmem/internal/testutil"
)

// hashPrefix starts the first line of a generated PTX file.
const hashPrefix = "// pinmem-source-sha256: "

// ErrPlaceholder is returned by Verify for a placeholder PTX whose hash line
// matches its source.
var ErrPlaceholder = errors.New("kernel.ptx is a placeholder: generate it with scripts/compile-kernels on a machine with nvcc")

// IsPlaceholder reports whether ptx is a placeholder: it says PLACEHOLDER and
// defines no kernel (.entry).
func IsPlaceholder(ptx []byte) bool {
	return bytes.Contains(ptx, []byte("PLACEHOLDER")) && !bytes.Contains(ptx, []byte(".entry"))
}

// Verify returns nil when ptx carries the SHA-256 of source on its first line
// and defines every kernel named in kernels (".entry name("). A placeholder
// with the right hash line gives ErrPlaceholder; anything else a descriptive
// error.
func Verify(source, ptx []byte, kernels ...string) error {
	line, _, _ := bytes.Cut(ptx, []byte("\n"))
	got, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte(hashPrefix))
	if !ok {
		return fmt.Errorf("kernel.ptx's first line is %q, want %q<sha256 of kernel.cu>", line, hashPrefix)
	}
	sum := sha256.Sum256(source)
	if want := hex.EncodeToString(sum[:]); string(bytes.TrimSpace(got)) != want {
		return fmt.Errorf("kernel.ptx was generated from a kernel.cu with sha256 %s, but kernel.cu has sha256 %s now: run scripts/compile-kernels on a machine with nvcc and commit kernel.ptx", got, want)
	}
	if IsPlaceholder(ptx) {
		return ErrPlaceholder
	}
	for _, k := range kernels {
		if !bytes.Contains(ptx, []byte(".entry "+k+"(")) {
			return fmt.Errorf("kernel.ptx defines no kernel %s (no \".entry %s(\")", k, k)
		}
	}
	return nil
}

// Check fails t when Verify reports an error. A placeholder skips t, except
// under PINMEM_REQUIRE_GPU=1 (the GPU suite), where it fails: the examples
// cannot run there without their kernels.
func Check(t testing.TB, source, ptx []byte, kernels ...string) {
	t.Helper()
	err := Verify(source, ptx, kernels...)
	switch {
	case err == nil:
	case errors.Is(err, ErrPlaceholder) && !testutil.GPURequired():
		t.Skip(err.Error())
	default:
		t.Fatal(err)
	}
}
