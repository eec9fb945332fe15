package kernels

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestBlockPTXShape checks what can be checked of the hand-written PTX
// without ptxas: the header directives, the entry point with its
// parameters, balanced braces, every register used is declared within
// its range, every branch target is a label, and the image is
// NUL-terminated. The GPU suite loads and runs it (cuda's kernel-strategy
// tests).
func TestBlockPTXShape(t *testing.T) {
	checkPTXShape(t, "blocks.ptx", blockPTX)
	if img := BlockCopyImage(); img[len(img)-1] != 0 || bytes.IndexByte(img[:len(img)-1], 0) >= 0 {
		t.Errorf("image is not one NUL-terminated string")
	}
}

func checkPTXShape(t *testing.T, name string, ptx []byte) {
	t.Helper()
	text := string(ptx)
	for _, want := range []string{".version 7.0\n", ".target sm_70\n", ".address_size 64\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("%s lacks %q", name, want)
		}
	}
	if !bytes.Contains(ptx, []byte(".visible .entry "+KernelBlockCopy+"(\n\t.param .u64 descs,\n\t.param .u32 count\n)")) {
		t.Errorf("%s does not define %s(.u64 descs, .u32 count)", name, KernelBlockCopy)
	}
	if strings.Count(text, "{") != strings.Count(text, "}") {
		t.Errorf("%s: unbalanced braces", name)
	}
	decl := map[string]int{}
	for _, m := range regexp.MustCompile(`\.reg \.\w+\s+%(\w+)<(\d+)>;`).FindAllStringSubmatch(text, -1) {
		var n int
		fmt.Sscan(m[2], &n)
		decl[m[1]] = n
	}
	body := text[strings.Index(text, "{\n\t.reg"):]
	for _, m := range regexp.MustCompile(`%([a-z]+)(\d+)\b`).FindAllStringSubmatch(body, -1) {
		var i int
		fmt.Sscan(m[2], &i)
		if n, ok := decl[m[1]]; !ok || i >= n {
			t.Errorf("%s: register %%%s%s not declared (declared: %v)", name, m[1], m[2], decl)
		}
	}
	labels := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z0-9]+):$`).FindAllStringSubmatch(text, -1) {
		labels[m[1]] = true
	}
	for _, m := range regexp.MustCompile(`bra\s+([A-Z0-9]+);`).FindAllStringSubmatch(text, -1) {
		if !labels[m[1]] {
			t.Errorf("%s: branch to undefined label %s", name, m[1])
		}
	}
}

// TestBlockCopyTwin checks the Go twin on a small memory.
func TestBlockCopyTwin(t *testing.T) {
	mem := make([]byte, 256)
	for i := range 64 {
		mem[i] = byte(i + 1)
	}
	descs := make([]byte, 2*BlockDescSize)
	put := func(b int, dst, src, n uint64) {
		binary.LittleEndian.PutUint64(descs[b*BlockDescSize:], dst)
		binary.LittleEndian.PutUint64(descs[b*BlockDescSize+8:], src)
		binary.LittleEndian.PutUint64(descs[b*BlockDescSize+16:], n)
	}
	put(0, 128, 0, 16)
	put(1, 200, 17, 5)
	err := BlockCopyTwin(descs, 2, func(a, n uint64) ([]byte, error) {
		if a+n > uint64(len(mem)) {
			return nil, fmt.Errorf("%d bytes at %d outside", n, a)
		}
		return mem[a : a+n], nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem[128:144], mem[0:16]) || !bytes.Equal(mem[200:205], mem[17:22]) {
		t.Errorf("twin copied wrong bytes")
	}
	put(1, 250, 0, 16)
	if err := BlockCopyTwin(descs, 2, func(a, n uint64) ([]byte, error) {
		if a+n > uint64(len(mem)) {
			return nil, fmt.Errorf("%d bytes at %d outside", n, a)
		}
		return mem[a : a+n], nil
	}); err == nil {
		t.Errorf("twin accepted a block past the memory's end")
	}
}

// TestBlockPTXAssembles runs ptxas (PTXAS, or ptxas on PATH or in
// $CUDA_HOME/bin) on the hand-written PTX for the oldest architecture the
// PTX targets (sm_70) and for sm_90, where one is found; without one it
// skips. A ptxas that no longer knows sm_70 (CUDA 13 dropped it: the
// driver still JIT-compiles the PTX for newer devices) is asked for
// sm_75, the oldest it knows.
func TestBlockPTXAssembles(t *testing.T) {
	ptxas := os.Getenv("PTXAS")
	if ptxas == "" {
		if p, err := exec.LookPath("ptxas"); err == nil {
			ptxas = p
		}
	}
	if ptxas == "" {
		home := os.Getenv("CUDA_HOME")
		if home == "" {
			home = "/usr/local/cuda"
		}
		if p := filepath.Join(home, "bin", "ptxas"); fileExists(p) {
			ptxas = p
		}
	}
	if ptxas == "" {
		t.Skip("no ptxas (set PTXAS or CUDA_HOME)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "blocks.ptx")
	if err := os.WriteFile(src, blockPTX, 0o644); err != nil {
		t.Fatal(err)
	}
	assemble(t, ptxas, dir, src)
}

// assemble runs ptxas on src for sm_70 (or sm_75) and sm_90.
func assemble(t *testing.T, ptxas, dir, src string) {
	t.Helper()
	for _, arch := range []string{"sm_70", "sm_90"} {
		out, err := exec.Command(ptxas, "-arch="+arch, "-o", filepath.Join(dir, arch+".cubin"), src).CombinedOutput()
		if err != nil && arch == "sm_70" && bytes.Contains(out, []byte("is not defined for option 'gpu-name'")) {
			t.Logf("this ptxas does not know sm_70; assembling for sm_75")
			arch = "sm_75"
			out, err = exec.Command(ptxas, "-arch="+arch, "-o", filepath.Join(dir, arch+".cubin"), src).CombinedOutput()
		}
		if err != nil {
			t.Errorf("ptxas -arch=%s %s: %v\n%s", arch, filepath.Base(src), err, out)
		}
	}
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
