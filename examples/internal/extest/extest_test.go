package extest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
)

func header(src string) string {
	sum := sha256.Sum256([]byte(src))
	return hashPrefix + hex.EncodeToString(sum[:]) + "\n"
}

func TestVerify(t *testing.T) {
	const src = "extern \"C\" __global__ void k(int* p) {}\n"
	good := header(src) + "//\n.version 9.0\n.visible .entry k(\n"
	if err := Verify([]byte(src), []byte(good), "k"); err != nil {
		t.Errorf("Verify(generated PTX) = %v, want nil", err)
	}
	if err := Verify([]byte(src), []byte(good), "k", "missing"); err == nil {
		t.Error("Verify accepted a PTX without kernel missing")
	}
	if err := Verify([]byte(src+" "), []byte(good), "k"); err == nil {
		t.Error("Verify accepted a PTX generated from another source")
	}
	if err := Verify([]byte(src), []byte(".version 9.0\n.visible .entry k(\n"), "k"); err == nil {
		t.Error("Verify accepted a PTX without a hash line")
	}
	ph := header(src) + "// PLACEHOLDER: not nvcc output\n"
	if err := Verify([]byte(src), []byte(ph), "k"); !errors.Is(err, ErrPlaceholder) {
		t.Errorf("Verify(placeholder) = %v, want ErrPlaceholder", err)
	}
	if err := Verify([]byte(src+"x"), []byte(ph), "k"); err == nil || errors.Is(err, ErrPlaceholder) {
		t.Errorf("Verify(placeholder of another source) = %v, want a hash mismatch", err)
	}
	// A generated file that mentions PLACEHOLDER in a comment is not one.
	if IsPlaceholder([]byte(good + "// PLACEHOLDER\n")) {
		t.Error("a PTX with .entry counts as a placeholder")
	}
}
