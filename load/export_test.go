package load

// PinnedBytes returns the bytes of pinned memory the Loader's stages hold.
func (l *Loader) PinnedBytes() int64 {
	return int64(l.cfg.depth) * int64(l.cfg.stageSize)
}
