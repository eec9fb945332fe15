package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// KindAll is the Kind of the matrix bench's aggregate row: every device at
// once.
const KindAll = "all"

// MatrixConfig configures Matrix. Zero fields take their defaults;
// out-of-range fields make Matrix fail with ErrInvalid.
type MatrixConfig struct {
	Devices []int    `json:"devices,omitempty"` // distinct device ordinals (empty: every device)
	Size    int64    `json:"size_bytes"`        // bytes per copy, 1 to MaxSize (0: 256 MiB)
	Dirs    []string `json:"dirs"`              // directions (AllDirs; empty: every direction)
	Samples int      `json:"samples"`           // timed samples, up to MaxSamples (0: 5)
	Reps    int      `json:"reps"`              // copies per sample and lane, up to 1000 (0: 4)
	// Session configures each device's session.
	Session SessionConfig `json:"session"`
}

// Validate reports the first field of c that Matrix would refuse, as an
// error matching ErrInvalid; c is not changed. Matrix validates its
// configuration itself: calling Validate first finds the error before any
// GPU work (the CLI checks its flags this way).
func (c MatrixConfig) Validate() error { return c.resolve() }

// Resolved returns c with its defaults filled in, as the measurement uses
// it (reports record it), or the error Validate gives.
func (c MatrixConfig) Resolved() (MatrixConfig, error) {
	err := c.resolve()
	return c, err
}

// resolve fills in the defaults of c's zero fields and checks the others.
func (c *MatrixConfig) resolve() error {
	switch {
	case c.Size == 0:
		c.Size = 256 << 20
	case c.Size < 0 || c.Size > MaxSize:
		return invalid("MatrixConfig.Size %d: want 1 to %d (0: the default, 256 MiB)", c.Size, int64(MaxSize))
	}
	if err := checkNames("MatrixConfig.Dirs", &c.Dirs, AllDirs()); err != nil {
		return err
	}
	if err := checkSamples("MatrixConfig.Samples", &c.Samples, 5); err != nil {
		return err
	}
	switch {
	case c.Reps == 0:
		c.Reps = 4
	case c.Reps < 0 || c.Reps > 1000:
		return invalid("MatrixConfig.Reps %d: want 1 to 1000 (0: the default, 4)", c.Reps)
	}
	seen := map[int]bool{}
	for _, d := range c.Devices {
		if d < 0 || seen[d] {
			return invalid("MatrixConfig.Devices %v: want distinct ordinals from 0", c.Devices)
		}
		seen[d] = true
	}
	return c.Session.resolve()
}

// DeviceKind names a device's row of the matrix ("gpu0").
func DeviceKind(ordinal int) string { return fmt.Sprintf("gpu%d", ordinal) }

// matrixDev is one device's share of the matrix bench.
type matrixDev struct {
	s          *Session
	hA, hB     *pinmem.Buffer
	devA, devB *cuda.DeviceBuffer
	stA, stB   *cuda.Stream
	expA, expB []byte
	placement  string
}

// Matrix measures host<->GPU bandwidth like nvbandwidth's matrix: one row
// per device (H2D, D2H and bidirectional copies between that device and
// portable pinned host memory placed on its NUMA node), then an "all" row
// with every device copying at the same time, reported as the sum of the
// devices' concurrent figures and compared, in its note, with the sum of
// the per-device rows. It returns the results (Bench "matrix", Kind
// "gpuN" or KindAll) and the metadata of the first device's session. ctx
// is checked before each sample: when it ends, Matrix returns the rows
// finished so far with ctx's error.
func Matrix(ctx context.Context, cfg MatrixConfig) ([]Result, Meta, error) {
	if ctx == nil {
		return nil, Meta{}, invalid("nil context")
	}
	if err := cfg.resolve(); err != nil {
		return nil, Meta{}, err
	}
	if err := cfg.everyDevice(); err != nil {
		return nil, Meta{}, err
	}
	devs, err := openMatrix(ctx, cfg)
	defer func() {
		for _, d := range devs {
			d.close()
		}
	}()
	if err != nil {
		return nil, Meta{}, err
	}
	m := devs[0].s.Meta("pinmem bench matrix")
	for _, d := range devs[1:] {
		m.Devices = append(m.Devices, deviceInfo(d.s.Props))
	}
	if len(devs) > 1 {
		m.Device = fmt.Sprintf("%d devices: %s", len(devs), strings.Join(deviceNames(devs), "; "))
	}
	var out []Result
	// Per device, one at a time.
	per := map[string][]Result{}
	for _, d := range devs {
		for _, dir := range cfg.Dirs {
			r, err := d.alone(ctx, cfg, dir)
			if err != nil {
				return out, m, err
			}
			d.s.progress(r)
			out = append(out, r)
			per[dir] = append(per[dir], r)
		}
	}
	// Every device at once.
	for _, dir := range cfg.Dirs {
		r, err := atOnce(ctx, cfg, devs, dir, per[dir])
		if err != nil {
			return out, m, err
		}
		devs[0].s.progress(r)
		out = append(out, r)
	}
	return out, m, nil
}

// everyDevice makes an empty device list every device there is.
func (c *MatrixConfig) everyDevice() error {
	if len(c.Devices) > 0 {
		return nil
	}
	n, err := cuda.DeviceCount()
	if err != nil {
		return err
	}
	for i := range n {
		c.Devices = append(c.Devices, i)
	}
	if n == 0 {
		return fmt.Errorf("bench: matrix: %w", cuda.ErrNoDevice)
	}
	return nil
}

// openMatrix opens a session on every device of cfg and sets up its
// buffers; it returns the devices opened so far also on error, to close.
func openMatrix(ctx context.Context, cfg MatrixConfig) ([]*matrixDev, error) {
	var devs []*matrixDev
	for _, ord := range cfg.Devices {
		s, err := Open(ctx, ord, cfg.Session)
		if err != nil {
			return devs, fmt.Errorf("bench: device %d: %w", ord, err)
		}
		d := &matrixDev{s: s}
		devs = append(devs, d)
		if err := d.setup(int(cfg.Size)); err != nil {
			return devs, fmt.Errorf("bench: device %d: %w", ord, err)
		}
	}
	return devs, nil
}

// alone measures direction dir on d while no other device copies: the
// result, skipped with the reason on a failure that does not end the run.
func (d *matrixDev) alone(ctx context.Context, cfg MatrixConfig, dir string) (Result, error) {
	n := int(cfg.Size)
	r := Result{Bench: "matrix", Kind: DeviceKind(d.s.Dev.Ordinal()), Dir: dir, Size: cfg.Size, Unit: GBps}
	var vals []float64
	err := d.repoison(n)
	for i := 0; err == nil && i < cfg.Samples; i++ {
		if err = ctx.Err(); err != nil {
			break
		}
		var v float64
		var t timing
		if v, t, err = d.sample(dir, n, cfg.Reps); err != nil {
			break
		}
		r.Timing = t.method
		vals = append(vals, v)
		if i == 0 {
			if verr := d.verify(dir, n); verr != nil {
				r.Note = joinNotes([]string{r.Note, verifyFailedMark + ": " + verr.Error()})
			} else {
				r.Verified = true
			}
		}
	}
	if err != nil {
		if isFatal(err) {
			return r, err
		}
		return skipped("matrix", r.Kind, dir, cfg.Size, GBps, "error: "+err.Error()), nil
	}
	r.fill(vals)
	r.Note = joinNotes([]string{r.Note, d.placement})
	return r, nil
}

// atOnce measures direction dir on every device at the same time: the
// aggregate of the devices' concurrent samples beside their rows measured
// alone (per), or a skipped result on a failure that does not end the run.
func atOnce(ctx context.Context, cfg MatrixConfig, devs []*matrixDev, dir string, per []Result) (Result, error) {
	n := int(cfg.Size)
	conc := make([][]float64, len(devs))
	methods := make([]string, len(devs))
	for _, d := range devs {
		if err := d.repoison(n); err != nil {
			return Result{}, err
		}
	}
	var sampleErr error
	for range cfg.Samples {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		var wg sync.WaitGroup
		errc := make([]error, len(devs))
		for i, d := range devs {
			wg.Go(func() {
				v, t, err := d.sample(dir, n, cfg.Reps)
				errc[i] = err
				if err == nil {
					conc[i] = append(conc[i], v)
					methods[i] = t.method
				}
			})
		}
		wg.Wait()
		if sampleErr = errors.Join(errc...); sampleErr != nil {
			break
		}
	}
	if sampleErr != nil {
		if isFatal(sampleErr) {
			return Result{}, sampleErr
		}
		return skipped("matrix", KindAll, dir, cfg.Size, GBps, "error: "+sampleErr.Error()), nil
	}
	r := aggregate(dir, cfg.Size, per, conc)
	r.Timing = methods[0]
	r.Verified = true
	for _, d := range devs {
		if err := d.verify(dir, n); err != nil {
			r.Verified = false
			r.Note = joinNotes([]string{verifyFailedMark + ": " + err.Error(), r.Note})
		}
	}
	return r, nil
}

// aggregate builds the "all devices at once" result of one direction:
// sample j's value is the sum over devices of their concurrent sample j;
// the note compares its median with the sum of the per-device medians
// measured one device at a time, and lists each device's concurrent median.
func aggregate(dir string, size int64, perDevice []Result, concurrent [][]float64) Result {
	r := Result{Bench: "matrix", Kind: KindAll, Dir: dir, Size: size, Unit: GBps}
	samples := 0
	for i, c := range concurrent {
		if i == 0 || len(c) < samples {
			samples = len(c)
		}
	}
	sums := make([]float64, samples)
	var parts []string
	for i, c := range concurrent {
		for j := range samples {
			sums[j] += c[j]
		}
		kind := fmt.Sprint(i)
		if i < len(perDevice) {
			kind = perDevice[i].Kind
		}
		parts = append(parts, fmt.Sprintf("%s %s", kind, formatValue(Summarize(c).Median)))
	}
	r.fill(sums)
	sum := 0.0
	for _, p := range perDevice {
		if !p.Skipped {
			sum += p.Median
		}
	}
	notes := []string{fmt.Sprintf("sum of per-device figures %s GB/s", formatValue(sum))}
	if sum > 0 && r.Median > 0 {
		notes = append(notes, fmt.Sprintf("at once / sum = %.2f", r.Median/sum))
	}
	notes = append(notes, "at once: "+strings.Join(parts, ", "))
	r.Note = joinNotes(notes)
	return r
}

func deviceNames(devs []*matrixDev) []string {
	var out []string
	for _, d := range devs {
		out = append(out, fmt.Sprintf("%s (device %d)", d.s.Props.Name, d.s.Dev.Ordinal()))
	}
	return out
}

func (d *matrixDev) setup(n int) error {
	var err error
	alloc := func() (*pinmem.Buffer, error) {
		b, err := pinmem.Alloc(n, pinmem.Portable, pinmem.WithDevice(d.s.Dev), pinmem.WithMethod(pinmem.MethodMmapRegister))
		if err != nil {
			b, err = pinmem.Alloc(n, pinmem.Portable, pinmem.WithDevice(d.s.Dev))
		}
		return b, err
	}
	if d.hA, err = alloc(); err != nil {
		return err
	}
	if d.hB, err = alloc(); err != nil {
		return err
	}
	d.placement = "host memory: portable, " + d.hA.Placement().String()
	if d.devA, err = d.s.Ctx.Alloc(n); err != nil {
		return err
	}
	if d.devB, err = d.s.Ctx.Alloc(n); err != nil {
		return err
	}
	if d.stA, err = d.s.Ctx.NewStream(cuda.StreamNonBlocking); err != nil {
		return err
	}
	if d.stB, err = d.s.Ctx.NewStream(cuda.StreamNonBlocking); err != nil {
		return err
	}
	d.expA = randomBytes(n, uint64(10+d.s.Dev.Ordinal()))
	d.expB = randomBytes(n, uint64(20+d.s.Dev.Ordinal()))
	copy(d.hA.Bytes(), d.expA)
	_, err = d.devB.WriteAt(d.expB, 0)
	return err
}

// repoison poisons the destinations of both directions, so that the next
// verification sees only what the next copies wrote.
func (d *matrixDev) repoison(n int) error {
	poison(d.hB.Bytes()[:n], poisonHost)
	return memsetPrefix(d.devA, poisonDevice, n)
}

func (d *matrixDev) close() {
	for _, st := range []*cuda.Stream{d.stA, d.stB} {
		if st != nil {
			_ = st.Synchronize(context.Background())
			_ = st.Destroy()
		}
	}
	for _, b := range []*cuda.DeviceBuffer{d.devA, d.devB} {
		if b != nil {
			_ = b.Free()
		}
	}
	for _, b := range []*pinmem.Buffer{d.hA, d.hB} {
		if b != nil {
			_ = b.Free()
		}
	}
	_ = d.s.Close()
}

// sample times reps copies in dir: h2d copies host A to device A, d2h
// device B to host B, bidir both at once on two streams.
func (d *matrixDev) sample(dir string, n, reps int) (float64, timing, error) {
	h2d := lane{s: d.stA, op: func(st *cuda.Stream, _ int) error { return st.CopyHtoD(d.devA, 0, d.hA.Bytes()[:n]) }}
	d2h := lane{s: d.stB, op: func(st *cuda.Stream, _ int) error { return st.CopyDtoH(d.hB.Bytes()[:n], d.devB, 0) }}
	var lanes []lane
	switch dir {
	case DirH2D:
		lanes = []lane{h2d}
	case DirD2H:
		lanes = []lane{d2h}
	default:
		lanes = []lane{h2d, d2h}
	}
	t, err := d.s.timeLanes(lanes, reps, true)
	if err != nil {
		return 0, t, err
	}
	return Rate(int64(len(lanes))*int64(n)*int64(reps), t.span), t, nil
}

// verify checks what sample's copies in dir left behind.
func (d *matrixDev) verify(dir string, n int) error {
	if dir != DirD2H {
		got := make([]byte, n)
		if _, err := d.devA.ReadAt(got, 0); err != nil {
			return err
		}
		if i := firstDiff(got, d.expA[:n]); i >= 0 {
			return fmt.Errorf("device %d byte %d is %#x after host-to-device, want %#x", d.s.Dev.Ordinal(), i, got[i], d.expA[i])
		}
	}
	if dir != DirH2D {
		got := d.hB.Bytes()[:n]
		if i := firstDiff(got, d.expB[:n]); i >= 0 {
			return fmt.Errorf("device %d: host byte %d is %#x after device-to-host, want %#x", d.s.Dev.Ordinal(), i, got[i], d.expB[i])
		}
	}
	return nil
}

// WriteMatrix writes matrix results as nvbandwidth prints its matrices:
// one row per device and the "all" row, one column per direction, GB/s
// medians; then a "sum" row of the per-device figures and the notes of
// the aggregate rows.
func WriteMatrix(w io.Writer, m Meta, results []Result) error {
	var b strings.Builder
	if m.Command != "" {
		fmt.Fprintf(&b, "# %s on %s, driver %s\n", m.Command, m.Device, m.Driver)
	}
	if m.Timing != "" {
		fmt.Fprintf(&b, "# timing: %s\n", m.Timing)
	}
	g := gridOf(results)
	if g.size > 0 {
		fmt.Fprintf(&b, "# host<->GPU bandwidth, GB/s (median), %s per copy\n", FormatSize(g.size))
	}
	writeColumns(&b, g.table())
	for _, d := range g.dirs {
		if r, ok := g.cell[[2]string{KindAll, d}]; ok && r.Note != "" {
			fmt.Fprintf(&b, "# all %s: %s\n", d, r.Note)
		}
	}
	for _, k := range g.rows {
		if r, ok := g.cell[[2]string{k, g.dirs[0]}]; ok && k != KindAll && r.Note != "" {
			fmt.Fprintf(&b, "# %s: %s\n", k, r.Note)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// matrixGrid is the matrix results by row (kind) and column (direction),
// in the order they first appear.
type matrixGrid struct {
	rows, dirs []string
	cell       map[[2]string]Result // by kind and direction
	size       int64                // bytes per copy
}

func gridOf(results []Result) matrixGrid {
	g := matrixGrid{cell: map[[2]string]Result{}}
	for _, r := range results {
		if r.Bench != "matrix" {
			continue
		}
		if !contains(g.rows, r.Kind) {
			g.rows = append(g.rows, r.Kind)
		}
		if !contains(g.dirs, r.Dir) {
			g.dirs = append(g.dirs, r.Dir)
		}
		g.cell[[2]string{r.Kind, r.Dir}] = r
		g.size = r.Size
	}
	return g
}

// table returns the matrix's cells as text, the header first; with more
// than one row, a last row sums the devices' own rows.
func (g matrixGrid) table() [][]string {
	sums := map[string]float64{}
	table := [][]string{append([]string{"DEVICE"}, upper(g.dirs)...)}
	for _, k := range g.rows {
		line := []string{k}
		if k == KindAll {
			line[0] = "all at once"
		}
		for _, d := range g.dirs {
			r, ok := g.cell[[2]string{k, d}]
			line = append(line, matrixCell(r, ok))
			if ok && !r.Skipped && k != KindAll {
				sums[d] += r.Median
			}
		}
		table = append(table, line)
	}
	if len(g.rows) > 1 {
		line := []string{"sum of rows"}
		for _, d := range g.dirs {
			line = append(line, formatValue(sums[d]))
		}
		table = append(table, line)
	}
	return table
}

// matrixCell is a cell's text: the median, marked "!" when not verified.
func matrixCell(r Result, ok bool) string {
	switch {
	case !ok:
		return "-"
	case r.Skipped:
		return "skipped"
	case !r.Verified:
		return formatValue(r.Median) + "!"
	}
	return formatValue(r.Median)
}

// writeColumns writes table's lines, the first column left-aligned and
// the others right-aligned, two spaces apart.
func writeColumns(b *strings.Builder, table [][]string) {
	widths := make([]int, len(table[0]))
	for _, l := range table {
		for i, c := range l {
			widths[i] = max(widths[i], len(c))
		}
	}
	for _, l := range table {
		for i, c := range l {
			if i == 0 {
				fmt.Fprintf(b, "%-*s", widths[i], c)
			} else {
				fmt.Fprintf(b, "  %*s", widths[i], c)
			}
		}
		b.WriteString("\n")
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func upper(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strings.ToUpper(v)
	}
	return out
}
