package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/pinmem/pinmem/examples/internal/extest"
)

// TestVerifyPTX checks extest.Verify, the hash check every example's
// TestKernelPTX uses, on made-up sources and PTX. (It lives here rather than
// in extest's own test binary, to keep the GPU suite's bundle small.)
func TestVerifyPTX(t *testing.T) {
	header := func(src string) string {
		sum := sha256.Sum256([]byte(src))
		return "// pinmem-source-sha256: " + hex.EncodeToString(sum[:]) + "\n"
	}
	const src = "extern \"C\" __global__ void k(int* p) {}\n"
	good := header(src) + "//\n.version 9.0\n.visible .entry k(\n"
	if err := extest.Verify([]byte(src), []byte(good), "k"); err != nil {
		t.Errorf("Verify(generated PTX) = %v, want nil", err)
	}
	if err := extest.Verify([]byte(src), []byte(good), "k", "missing"); err == nil {
		t.Error("Verify accepted a PTX without kernel missing")
	}
	if err := extest.Verify([]byte(src+" "), []byte(good), "k"); err == nil {
		t.Error("Verify accepted a PTX generated from another source")
	}
	if err := extest.Verify([]byte(src), []byte(".version 9.0\n.visible .entry k(\n"), "k"); err == nil {
		t.Error("Verify accepted a PTX without a hash line")
	}
	ph := header(src) + "// PLACEHOLDER: not nvcc output\n"
	if err := extest.Verify([]byte(src), []byte(ph), "k"); !errors.Is(err, extest.ErrPlaceholder) {
		t.Errorf("Verify(placeholder) = %v, want ErrPlaceholder", err)
	}
	if err := extest.Verify([]byte(src+"x"), []byte(ph), "k"); err == nil || errors.Is(err, extest.ErrPlaceholder) {
		t.Errorf("Verify(placeholder of another source) = %v, want a hash mismatch", err)
	}
	if extest.IsPlaceholder([]byte(good + "// PLACEHOLDER\n")) {
		t.Error("a PTX with .entry counts as a placeholder")
	}
}
