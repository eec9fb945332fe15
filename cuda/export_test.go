package cuda

// SetBindOnCall switches bindOnCall for benchmarks and returns the previous
// setting.
func SetBindOnCall(on bool) (prev bool) { return bindOnCall.Swap(on) }
