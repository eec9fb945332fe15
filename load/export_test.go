package load

// PinnedBytes returns the bytes of pinned memory the Loader's stages hold
// now: the stages that reads have taken, none before the first load.
func (l *Loader) PinnedBytes() int64 {
	var n int64
	for _, st := range l.stages {
		n += int64(len(st.mem))
	}
	return n
}
