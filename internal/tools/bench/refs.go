package bench

import "strings"

// The same-run reference of each row: what a figure is compared with in
// reports, the markdown rendering and the docs. One table, one place.

// CRefPrefix starts the kind of a row measured by the C reference programs
// (cref/): "c:pinned" is cref/bw's pinned kind.
const CRefPrefix = "c:"

// KindImageStagedBound is the image pipeline's bound for Go frames: a
// frame in and out at the rate of Go memory staged both ways at once
// (examples/imagepipeline/measure). Its copy bound is kind VariantBound.
const KindImageStagedBound = "staged-bound"

// referenceKind returns the kind a row of bench and kind is compared with
// in the same run ("" when none):
//   - bw: a Go-memory kind against the driver's synchronous pageable copy
//     (both timed by the wall clock); the asynchronous pageable kind and
//     pinned against the C reference's; the other pinned kinds against
//     pinned;
//   - pin: every method against hostalloc (cuMemHostAlloc);
//   - overlap: every variant against pageable-sync; vecadd against pageable;
//   - zerocopy: zero-copy against the explicit copy;
//   - blocks: every strategy against the C loop (one copy per block),
//     else one contiguous copy;
//   - concurrency: the shared Copier against the driver's copy;
//   - load: the loader and a checkpoint against PyTorch, the loader
//     else against parallel reads;
//   - imagepipeline: the naive and pinned loops against the C baseline's
//     same loops (pinned ones else the copy bound), one stream against
//     the copy bound, the Pipeline from Go memory against the staged
//     bound (KindImageStagedBound).
func referenceKind(bench, kind string) string {
	ref, ok := fixedRefs[bench]
	if !ok && refOf[bench] != nil {
		ref = refOf[bench](kind)
	}
	if ref == kind || kind == VariantBound {
		return "" // a bound is computed: nothing to compare it with
	}
	return ref
}

// fixedRefs are the benches whose every row has one reference.
var fixedRefs = map[string]string{
	"pin":         PinHostAlloc,
	"overlap":     VariantPageableSync,
	"vecadd":      KindPageable,
	"zerocopy":    VariantExplicit,
	"concurrency": KindPageableSync,
}

// refOf gives the reference of a row of kind for the other benches.
var refOf = map[string]func(kind string) string{
	"bw": func(kind string) string {
		switch kind {
		case KindCopier, KindGoRegister:
			return KindPageableSync
		case KindPageable, KindPinned, KindPortable, KindWriteCombined, KindMapped:
			return CRefPrefix + kind
		case KindMmapRegister:
			return KindPinned
		}
		return ""
	},
	"blocks": func(kind string) string {
		if kind == CRefPrefix+"loop" || kind == CRefPrefix+"batch" {
			return CRefPrefix + "contiguous"
		}
		return CRefPrefix + "loop"
	},
	"load": func(kind string) string {
		if kind == "loader" || kind == "checkpoint" {
			return KindTorch
		}
		return ""
	},
	"imagepipeline": func(kind string) string {
		switch {
		case kind == VariantPinned1:
			return VariantBound
		case kind == "naive" || strings.HasPrefix(kind, "pinned-"):
			return CRefPrefix + kind
		case kind == "pipeline":
			return KindImageStagedBound
		}
		return ""
	},
}

// referenceCandidates returns the reference kinds for a row of bench and
// kind, first choice first: referenceKind's, then the fallbacks
// AddReferences tries where that row is missing (some may be "").
func referenceCandidates(bench, kind string) []string {
	cands := []string{referenceKind(bench, kind)}
	if bench == "bw" {
		switch kind {
		case KindPortable, KindWriteCombined, KindMapped:
			cands = append(cands, KindPinned)
		case KindPageable:
			cands = append(cands, KindPageableSync)
		case KindPinned, KindCopier:
			// Without the C reference, pinned memory against the
			// driver's copy of Go memory; a Copier against the
			// pageable copy where no pageable-sync row exists (the
			// reports before pageable-sync, of kind staged).
			cands = append(cands, KindPageableSync, KindPageable)
		}
	}
	switch {
	case bench == "blocks" && kind != BlockKindContiguous:
		cands = append(cands, BlockKindContiguous)
	case bench == "load" && kind == "loader":
		cands = append(cands, "read-parallel")
	case bench == "imagepipeline" && strings.HasPrefix(kind, "pinned-"):
		cands = append(cands, VariantBound)
	}
	return cands
}

// AddReferences sets every result's Ref and Ratio from the rows of the
// same results (one run) with the reference kind (referenceKind) and the
// same bench, direction, size and unit. A result whose reference is not
// in rs, or skipped, keeps an empty Ref; a bw row whose C reference is
// missing falls back to pinned (the other pinned kinds), pageable-sync
// (pageable), or pageable-sync and then pageable (pinned).
func AddReferences(rs []Result) {
	type key struct {
		bench, kind, dir string
		size             int64
		unit             Unit
	}
	byKey := map[key]Result{}
	for _, r := range rs {
		if !r.Skipped {
			byKey[key{r.Bench, r.Kind, r.Dir, r.Size, r.Unit}] = r
		}
	}
	for i := range rs {
		r := &rs[i]
		if r.Paired && r.Ref != "" && r.Ratio > 0 {
			continue // measured side by side with its reference: kept
		}
		r.Ref, r.Ratio = "", 0
		cands := referenceCandidates(r.Bench, r.Kind)
		for _, ref := range cands {
			if ref == "" {
				continue
			}
			b, ok := byKey[key{r.Bench, ref, r.Dir, r.Size, r.Unit}]
			if !ok {
				continue
			}
			if x, ok := Ratio(*r, b); ok {
				r.Ref, r.Ratio = ref, x
				break
			}
		}
	}
}
