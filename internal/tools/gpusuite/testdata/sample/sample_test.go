// Package sample is a test package with every outcome the GPU suite's
// summary must count: passes, a failure, skips (reason logged before and
// after the skip line), subtests, a feature-skip line, and a hang when
// SAMPLE_HANG is set. gpusuite's tests run it through test2json.
package sample

import (
	"fmt"
	"os"
	"testing"
	"time"
)

func TestPass(t *testing.T) { t.Log("all good") }

func TestFail(t *testing.T) {
	t.Log("first message")
	t.Errorf("got %d, want %d", 1, 2)
}

func TestSkipWithReason(t *testing.T) { t.Skip("no GPU: PINMEM_REQUIRE_GPU is unset") }

func TestSkipLate(t *testing.T) {
	defer t.Skip("skipped at the end")
	t.Log("working")
}

func TestSkipNoReason(t *testing.T) { t.SkipNow() }

func TestSub(t *testing.T) {
	t.Run("a", func(t *testing.T) {})
	t.Run("b", func(t *testing.T) { t.Skip("b needs two devices") })
	t.Run("c", func(t *testing.T) { t.Fatal("c broke") })
}

func TestFeatureSkips(t *testing.T) {
	fmt.Println("FEATURE SKIPS: managed memory (device attribute 0)")
}

func TestHang(t *testing.T) {
	if os.Getenv("SAMPLE_HANG") == "" {
		return
	}
	time.Sleep(time.Hour)
}
