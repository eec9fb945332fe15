package cudadrv

// MissingSymbols returns the names of the symbols in SymbolNames that the
// real driver library d lacks (an older driver), or nil when every symbol
// resolved or d is not the real driver.
func MissingSymbols(d Driver) []string {
	l, ok := d.(*lib)
	if !ok || l == nil {
		return nil
	}
	var out []string
	for _, e := range l.s.table() {
		if *e.addr == 0 {
			out = append(out, e.name)
		}
	}
	return out
}
