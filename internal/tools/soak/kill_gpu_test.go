package soak_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/sysinfo"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

const envChild = "PINMEM_SOAK_KILL_CHILD"

const killPin = 2 << 30 // bytes pinned by each method in the child

func meminfo(t *testing.T) *sysinfo.Meminfo {
	t.Helper()
	m, err := sysinfo.Reader{}.Meminfo()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

const gib = float64(1 << 30)

// TestGPUKillMidTransfer starts a child that pins 2 GiB with
// cuMemHostAlloc and 2 GiB by registration and copies them to the device
// in a loop, kills it with SIGKILL in the middle of its copies, and checks
// that the host gets the memory back: Shmem (where cuMemHostAlloc memory
// shows) and MemAvailable (which registered memory lowers) rise first and
// return to their baseline after the kill.
func TestGPUKillMidTransfer(t *testing.T) {
	if os.Getenv(envChild) == "1" {
		killChild()
		return
	}
	testutil.GPUContext(t)
	before := meminfo(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestGPUKillMidTransfer$")
	cmd.Env = append(os.Environ(), envChild+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line := sc.Text(); line == "READY" {
				ready <- nil
				return
			} else if strings.HasPrefix(line, "ERROR") {
				ready <- errors.New(line)
				return
			}
		}
		ready <- errors.New("child exited before it was ready")
	}()
	select {
	case err := <-ready:
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("child not ready after 2 minutes")
	}
	during := meminfo(t)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed := time.Now()
	shmemRise := float64(int64(during.Shmem)-int64(before.Shmem)) / gib
	availDrop := float64(int64(before.MemAvailable)-int64(during.MemAvailable)) / gib
	t.Logf("SOAK: kill: before Shmem %.2f GiB MemAvailable %.2f GiB; child holding %d GiB hostalloc + %d GiB registered: Shmem +%.2f GiB, MemAvailable -%.2f GiB",
		float64(before.Shmem)/gib, float64(before.MemAvailable)/gib, killPin>>30, killPin>>30, shmemRise, availDrop)
	if shmemRise < 0.9*float64(killPin)/gib {
		t.Errorf("Shmem rose by %.2f GiB while the child held %d GiB of cuMemHostAlloc memory", shmemRise, killPin>>30)
	}
	if availDrop < 0.9*float64(2*killPin)/gib {
		t.Errorf("MemAvailable fell by %.2f GiB while the child held %d GiB pinned", availDrop, 2*killPin>>30)
	}
	// The driver releases a dead process's pinned pages when its file
	// descriptors close; nothing signals when, so poll, bounded at 30 s.
	var after *sysinfo.Meminfo
	for {
		after = meminfo(t)
		shm := int64(after.Shmem) - int64(before.Shmem)
		avail := int64(before.MemAvailable) - int64(after.MemAvailable)
		if shm < 64<<20 && avail < 256<<20 {
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Errorf("30 s after SIGKILL: Shmem still +%.2f GiB, MemAvailable still -%.2f GiB", float64(shm)/gib, float64(avail)/gib)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("SOAK: kill: %.1f s after SIGKILL: Shmem %+.3f GiB, MemAvailable %+.3f GiB against the baseline",
		time.Since(killed).Seconds(), float64(int64(after.Shmem)-int64(before.Shmem))/gib, float64(int64(after.MemAvailable)-int64(before.MemAvailable))/gib)
}

// killChild pins memory both ways, prints READY and copies until killed.
func killChild() {
	fail := func(err error) {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	ha, err := pinmem.Alloc(killPin, 0, pinmem.WithMethod(pinmem.MethodHostAlloc))
	if err != nil {
		fail(err)
	}
	reg, err := pinmem.Alloc(killPin, 0, pinmem.WithMethod(pinmem.MethodMmapRegister))
	if err != nil {
		fail(err)
	}
	for _, b := range [][]byte{ha.Bytes(), reg.Bytes()} {
		for i := 0; i < len(b); i += 4096 {
			b[i] = byte(i >> 12)
		}
	}
	ctx, err := primary()
	if err != nil {
		fail(err)
	}
	dev, err := ctx.Alloc(256 << 20)
	if err != nil {
		fail(err)
	}
	s, err := ctx.NewStream(0)
	if err != nil {
		fail(err)
	}
	// READY, printed once the first copy has run, tells the parent that
	// copies are under way: from then on one is always queued or running.
	for i := 0; ; i++ {
		src := ha.Bytes()
		if i%2 == 1 {
			src = reg.Bytes()
		}
		off := (i * (256 << 20)) % (killPin - (256 << 20))
		if err := s.CopyHtoD(dev, 0, src[off:off+256<<20]); err != nil {
			fail(err)
		}
		if err := s.Synchronize(context.Background()); err != nil {
			fail(err)
		}
		if i == 0 {
			fmt.Println("READY")
		}
	}
}
