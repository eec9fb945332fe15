package transfer

import "testing"

// TestRouteBands: the per-size choices of route and stagePieces for a
// default Copier equal the bands measured on the H200 that the Copier
// took at 651be6c, both ways; the one change is host to device from
// 64 KiB to 1 MiB, where the driver's own pageable copy (removed: it
// outlived calls whose context ended) gives way to one stage. Up to 1 MiB
// that stage is a small one (pathSmall), of the same schedule.
func TestRouteBands(t *testing.T) {
	const KiB, MiB = 1 << 10, 1 << 20
	h, d := HostToDevice, DeviceToHost
	for _, tc := range []struct {
		dir    Direction
		n      int
		path   path
		pieces int
		was    string // the path at 651be6c
	}{
		{h, 1, pathSmall, 1, "stage"},
		{h, 4 * KiB, pathSmall, 1, "stage"},
		{h, 64 * KiB, pathSmall, 1, "stage"},
		{h, 64*KiB + 1, pathSmall, 1, "driver"},
		{h, 256 * KiB, pathSmall, 1, "driver"},
		{h, MiB - 1, pathSmall, 3, "driver"},
		{h, MiB, pathSmall, 4, "stage"},
		{h, 2*MiB - 1, pathStage, 4, "stage"},
		{h, 2 * MiB, pathStage, 1, "stage"},
		{h, 16*MiB - 1, pathStage, 1, "stage"},
		{h, 16 * MiB, pathStage, 2, "stage"},
		{h, 32 * MiB, pathStage, 2, "stage"},
		{h, 32*MiB + 1, pathRing, 0, "ring"},
		{h, 1 << 30, pathRing, 0, "ring"},
		{d, 1, pathSmall, 1, "stage"},
		{d, 64*KiB + 1, pathSmall, 1, "stage"},
		{d, MiB, pathSmall, 1, "stage"},
		{d, 16*MiB - 1, pathStage, 1, "stage"},
		{d, 16 * MiB, pathStage, 2, "stage"},
		{d, 32 * MiB, pathStage, 2, "stage"},
		{d, 32*MiB + 1, pathRing, 0, "ring"},
	} {
		got := route(tc.n, DefaultStageSize, byRoute)
		if got != tc.path {
			t.Errorf("%v %d bytes: %v, want %v (was %s)", tc.dir, tc.n, got, tc.path, tc.was)
		}
		if tc.path != pathRing {
			if k, _ := stagePieces(tc.dir, tc.n, 0); k != tc.pieces {
				t.Errorf("%v %d bytes: %d pieces, want %d", tc.dir, tc.n, k, tc.pieces)
			}
		}
	}
	// Forced paths, and a Copier whose stage does not hold the transfer.
	for _, tc := range []struct {
		n, stage int
		how      strategy
		want     path
	}{
		{4096, DefaultStageSize, forceStaged, pathRing},
		{64 << 20, 128 << 20, forceShort, pathStage},
		{64 << 20, 128 << 20, byRoute, pathRing},
		{128 << 10, 64 << 10, byRoute, pathRing},
		{128 << 10, 64 << 10, forceShort, pathRing},
		{4096, 64 << 10, byRoute, pathStage}, // stages no larger than a small one: one class
		{4096, 2 << 20, byRoute, pathSmall},
		{1<<20 + 1, 2 << 20, byRoute, pathStage},
	} {
		if got := route(tc.n, tc.stage, tc.how); got != tc.want {
			t.Errorf("%d bytes, stage %d, how %d: %v, want %v", tc.n, tc.stage, tc.how, got, tc.want)
		}
	}
}
