package cudatest_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/transfer"
)

// upload is the code under test in the README's snippet: a service's
// upload of 64 MiB through a Copier.
func upload(ctx context.Context) error {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}
	cp, err := transfer.New(gpu)
	if err != nil {
		return err
	}
	defer cp.Close(ctx)
	buf, err := gpu.Alloc(64 << 20)
	if err != nil {
		return err
	}
	defer buf.Free()
	_, err = cp.HtoD(ctx, buf, make([]byte, 64<<20))
	return err
}

// readme: begin
func TestUpload(t *testing.T) {
	drv := cudatest.Install(t) // a fake GPU until t ends; leak-checked then
	// The 2nd host-to-device copy fails, whichever driver call makes it.
	if err := drv.FailOn(cudatest.AnyHtoD, cudatest.Nth(2), cuda.ResultLaunchFailed); err != nil {
		t.Fatal(err)
	}
	if err := upload(context.Background()); !errors.Is(err, cuda.ErrLaunchFailed) {
		t.Fatalf("upload: %v; want the injected failure", err)
	}
}

// readme: end

// TestReadmeSnippet keeps the README's cudatest example identical to
// TestUpload above, so the README shows code that compiles and passes.
func TestReadmeSnippet(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	between := func(b []byte, begin, end string) string {
		s := string(b)
		i, j := strings.Index(s, begin), strings.Index(s, end)
		if i < 0 || j < i {
			t.Fatalf("markers %q .. %q not found", begin, end)
		}
		return strings.TrimSpace(s[i+len(begin) : j])
	}
	doc := between(readme, "<!-- cudatest snippet: begin (cudatest/readme_test.go) -->", "<!-- cudatest snippet: end -->")
	doc = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(doc, "```go"), "```"))
	code := between(src, "// readme: begin", "// readme: end")
	if !bytes.Equal([]byte(doc), []byte(code)) {
		t.Errorf("README's cudatest snippet differs from TestUpload in cudatest/readme_test.go:\nREADME:\n%s\ncode:\n%s", doc, code)
	}
}
