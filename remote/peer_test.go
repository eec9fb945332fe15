package remote

// peerMain runs the peer role of a two-process test when the test binary
// was started as one; it reports whether it did.
func peerMain() bool { return false }
