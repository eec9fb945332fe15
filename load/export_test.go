package load

// PinnedBytes returns the bytes of pinned memory the Loader's stages hold.
// A load in ModeMapped registers, besides, at most as many bytes of the
// files' pages at a time (one window in place of each stage it fills).
func (l *Loader) PinnedBytes() int64 {
	return int64(l.cfg.depth) * int64(l.cfg.stageSize)
}
