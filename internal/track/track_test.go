package track

import (
	"runtime"
	"strings"
	"sync"
	"testing"
)

func TestAddRemoveCountReport(t *testing.T) {
	EnableStacks(true)
	defer EnableStacks(false)
	Add(HostAlloc, 0x1000, 4096)
	Add(Registration, 0x2000, 8192)
	Add(Stream, 0x3000, 0)
	if n, b := Count(HostAlloc); n != 1 || b != 4096 {
		t.Errorf("Count(HostAlloc) = %d, %d", n, b)
	}
	r := Report()
	for _, want := range []string{"3 driver object(s) still live", "pinned allocation 0x1000 (4096 bytes)", "registration 0x2000", "stream 0x3000", "TestAddRemoveCountReport"} {
		if !strings.Contains(r, want) {
			t.Errorf("report lacks %q:\n%s", want, r)
		}
	}
	if !Remove(HostAlloc, 0x1000) || Remove(HostAlloc, 0x1000) {
		t.Error("Remove should report true once, then false")
	}
	Remove(Registration, 0x2000)
	Remove(Stream, 0x3000)
	if Report() != "" || len(Live()) != 0 {
		t.Errorf("objects left: %v", Live())
	}
}

func TestNoStacksWhenDisabled(t *testing.T) {
	EnableStacks(false)
	Add(Event, 1, 0)
	defer Remove(Event, 1)
	if !strings.Contains(Report(), "stacks were not enabled") {
		t.Errorf("report should say stacks were off:\n%s", Report())
	}
}

func TestConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				id := uint64(g<<20 | i)
				Add(DeviceMemory, id, 1)
				Remove(DeviceMemory, id)
			}
		}(g)
	}
	wg.Wait()
	if n, _ := Count(DeviceMemory); n != 0 {
		t.Errorf("%d left", n)
	}
	if Kind(99).String() != "kind(99)" || Module.String() != "module" {
		t.Error("Kind.String")
	}
}

func TestDroppedCounts(t *testing.T) {
	before := DroppedCounts()["testowner"]
	Dropped("testowner", "size", 1)
	Dropped("testowner")
	if got := DroppedCounts()["testowner"] - before; got != 2 {
		t.Fatalf("DroppedCounts[testowner] rose by %d, want 2", got)
	}
	found := false
	for _, k := range DroppedKinds() {
		found = found || k == "testowner"
	}
	if !found {
		t.Fatalf("DroppedKinds() = %v, want testowner among them", DroppedKinds())
	}
}

// TestStackGarbage: recording an object's creation stack costs its program
// counters, not a formatted stack (some 6 KiB), so that a process that
// creates and releases driver objects all day with stacks on (a test
// binary, a cudatest user, a soak) makes little garbage; the stack is
// formatted when a report asks.
func TestStackGarbage(t *testing.T) {
	EnableStacks(true)
	defer EnableStacks(false)
	const n = 1000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range n {
		Add(Registration, uint64(0x10000+i), 4096)
		Remove(Registration, uint64(0x10000+i))
	}
	runtime.ReadMemStats(&after)
	per := (after.TotalAlloc - before.TotalAlloc) / n
	t.Logf("%d bytes allocated per tracked object with stacks on", per)
	if per > 512 {
		t.Errorf("%d bytes allocated per tracked object with stacks on, want at most 512 (program counters, not a formatted stack)", per)
	}
	Add(Registration, 0x1, 4096)
	defer Remove(Registration, 0x1)
	if r := Report(); !strings.Contains(r, "TestStackGarbage") || !strings.Contains(r, "track_test.go:") {
		t.Errorf("the report lacks the creation stack:\n%s", r)
	}
}
