package load

import "testing"

// TestSettingsFor: the loader's defaults by the machine's cores, with the
// measurements behind them (H100 host, PCIe Gen5 x16, 16 cores, a warm
// 4 GiB checkpoint in 4 shards, pinmem bench load at 161fae3 and
// at 868c741).
func TestSettingsFor(t *testing.T) {
	for _, c := range []struct {
		cores int
		want  Settings
		why   string
	}{
		{1, Settings{1, 4 << 20, 2, 2}, "one core: one reader, and a second stage so that a read overlaps the last copy"},
		{2, Settings{2, 4 << 20, 4, 2}, "a reader per core: each copies 5-6 GB/s out of the page cache"},
		{8, Settings{8, 4 << 20, 16, 2}, "8 readers: the host read 33-39 GB/s with 8 goroutines, below PCIe: every core is needed"},
		{16, Settings{16, 4 << 20, 32, 2}, "16 readers of 8 MiB: 48.1 GB/s = 0.87 of pinned, against 33.3 = 0.61 with the old 8 readers of 16 MiB; the host read 71 GB/s"},
		{64, Settings{16, 4 << 20, 32, 2}, "16 readers already outrun PCIe Gen5 (71-86 GB/s of page-cache reads): more pin more and add nothing"},
		{0, Settings{1, 4 << 20, 2, 2}, "a machine that reports no core still gets one reader"},
	} {
		if got := settingsFor(c.cores); got != c.want {
			t.Errorf("settingsFor(%d) = %+v, want %+v: %s", c.cores, got, c.want, c.why)
		}
	}
	if d, c := DefaultSettings(), defaults(); d.Parallelism != c.parallel || d.StageSize != c.stageSize || d.Streams != c.streams {
		t.Errorf("DefaultSettings %+v and New's defaults %+v differ", d, c)
	}
}
