package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The suite: every headline figure in one run (`pinmem bench all`). Each
// part measures one figure's rows, with the same-run references those rows
// are compared with, and becomes one report file named after the part.

// SuiteEnv is what the suite's parts share.
type SuiteEnv struct {
	// Quick shrinks every part to a few small sizes and two samples: a
	// smoke run (and the CPU test on the fake driver), never figures to
	// publish.
	Quick bool `json:"quick"`
	// Samples overrides each part's default samples (0: the part's own).
	Samples int `json:"samples,omitempty"`
	// CRefDir is the directory of the built C reference programs
	// (cref/build -o DIR); "" skips the C rows.
	CRefDir string `json:"cref_dir,omitempty"`
	// Open opens another session on the same device with cfg (the parts
	// whose timing needs one of their own); it is set by the caller.
	Open func(ctx context.Context, cfg SessionConfig) (*Session, error) `json:"-"`
	// Progress receives a line per finished measurement of the parts that
	// open sessions of their own (the matrix); nil for none.
	Progress io.Writer `json:"-"`
	// Budget is the part's share of the run's time budget (0: none): the
	// part bounds each row's samples to fit it (Session.SetSampleBudget),
	// keeping every row with at least MinBudgetSamples samples.
	Budget time.Duration `json:"budget_ns,omitempty"`
}

// MinBudgetSamples is the fewest samples a row keeps under a time budget.
const MinBudgetSamples = 2

// budgetRows bounds the samples of each of the rows s measures next so
// that they fit env.Budget, with a fifth of it left for setup and
// verification (no bound without a budget).
func (e SuiteEnv) budgetRows(s *Session, rows int) {
	if e.Budget <= 0 || rows <= 0 {
		s.SetSampleBudget(0, 1)
		return
	}
	s.SetSampleBudget(e.Budget*4/5/time.Duration(rows), MinBudgetSamples)
}

// SuitePart is one part of the suite.
type SuitePart struct {
	Name    string // the part's file name without extension, and its name in -t
	Command string // the command that measures the same rows alone
	About   string // what the part measures, one line
	// Weight is the part's share of a time budget, against the other
	// parts' weights (SuiteShare).
	Weight float64
	// Run measures the part on s and returns its rows and the
	// configuration it used (reports record it). Rows measured before an
	// error are returned with it.
	Run func(ctx context.Context, s *Session, env SuiteEnv) ([]Result, any, error)
}

// SuiteShare returns a part's share of what is left of a time budget:
// left in proportion to its weight among the weights of the parts still
// to run (its own included), at least a second. A run that spent more
// than its share leaves the later parts less, so that the whole run ends
// near its budget.
func SuiteShare(left time.Duration, weight float64, weightsLeft float64) time.Duration {
	if weightsLeft <= 0 || weight <= 0 {
		return time.Second
	}
	return max(time.Duration(float64(left)*weight/weightsLeft), time.Second)
}

// samples returns env's sample count, or def.
func (e SuiteEnv) samples(def int) int {
	switch {
	case e.Samples > 0:
		return e.Samples
	case e.Quick:
		return 2
	}
	return def
}

// copierSizes are the sizes at which the Copier is compared with the
// driver: every power of four from 4 KiB to 1 GiB.
var copierSizes = []int64{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}

// suiteListBytes bounds the bytes of one list of the blocks part: lists
// of DefaultBlocks blocks up to 256 KiB, fewer larger blocks (512 of
// 2 MiB), since every block of every sample is verified by the CPU.
const suiteListBytes = 1 << 30

// bwRows is how many rows cfg measures.
func bwRows(cfg BandwidthConfig) int {
	cfg, _ = cfg.Resolved()
	return len(cfg.Kinds) * len(cfg.Sizes) * len(cfg.Dirs)
}

// SuiteParts returns the suite's parts in the order they run.
func SuiteParts() []SuitePart {
	return []SuitePart{
		{Name: "bw", Command: "pinmem bench", About: "every kind of host memory at four sizes, each way; pinned and pageable against the C reference", Weight: 3,
			Run: func(ctx context.Context, s *Session, env SuiteEnv) ([]Result, any, error) {
				cfg := BandwidthConfig{Samples: env.samples(5)}
				if env.Quick {
					cfg.Sizes, cfg.MinBytes = []int64{64 << 10, 1 << 20}, 1<<20
				}
				env.budgetRows(s, bwRows(cfg))
				return bwWithCRef(ctx, s, env, cfg, []string{KindPinned, KindPageable})
			}},
		{Name: "copier", Command: "pinmem bench --kinds copier,pageable-sync,pinned --sizes 4KiB,...,1GiB", About: "the Copier users get against the driver's own copy of Go memory, at every size from 4 KiB to 1 GiB", Weight: 3,
			Run: func(ctx context.Context, s *Session, env SuiteEnv) ([]Result, any, error) {
				cfg := BandwidthConfig{Kinds: []string{KindCopier, KindPageableSync, KindPageable, KindPinned}, Sizes: copierSizes, Samples: env.samples(5)}
				if env.Quick {
					cfg.Sizes, cfg.MinBytes = []int64{4 << 10, 1 << 20}, 1<<20
				}
				env.budgetRows(s, bwRows(cfg))
				rs, err := s.Bandwidth(ctx, cfg)
				return rs, cfg, err
			}},
		{Name: "concurrency", Command: "pinmem bench all -t concurrency", About: "many goroutines sharing one default Copier against each calling the driver's copy", Weight: 1,
			Run: func(ctx context.Context, s *Session, env SuiteEnv) ([]Result, any, error) {
				cfg := ConcurrencyConfig{Samples: env.samples(5)}
				if env.Quick {
					cfg.Goroutines, cfg.Sizes = []int{1, 4}, []int64{64 << 10}
				}
				if rc, err := cfg.Resolved(); err == nil {
					env.budgetRows(s, len(concurrencyKinds)*len(rc.Dirs)*len(rc.Goroutines)*len(rc.Sizes))
				}
				rs, err := s.Concurrency(ctx, cfg)
				return rs, cfg, err
			}},
		{Name: "pin", Command: "pinmem bench pin", About: "the cost of pinning and unpinning, per method and size", Weight: 1,
			Run: func(ctx context.Context, s *Session, env SuiteEnv) ([]Result, any, error) {
				cfg := PinConfig{Samples: env.samples(3)}
				if env.Quick {
					cfg.Sizes = []int64{1 << 20}
				}
				rs, err := s.Pin(ctx, cfg)
				return rs, cfg, err
			}},
		{Name: "overlap", Command: "pinmem bench overlap", About: "the pipeline (copy in, kernel, copy out per chunk) with and without overlap, and vector add", Weight: 1,
			Run: func(ctx context.Context, s *Session, env SuiteEnv) ([]Result, any, error) {
				cfg := OverlapConfig{Samples: env.samples(5)}
				if env.Quick {
					cfg.Chunks, cfg.ChunkSize, cfg.Streams, cfg.VecAddSize = 4, 64<<10, 2, 64<<10
				}
				rs, err := s.Overlap(ctx, cfg)
				return rs, cfg, err
			}},
		{Name: "zerocopy", Command: "pinmem zerocopy", About: "zero-copy reads of mapped host memory against an explicit copy, by reuse", Weight: 0.5,
			Run: func(ctx context.Context, s *Session, env SuiteEnv) ([]Result, any, error) {
				cfg := ZeroCopyConfig{Samples: env.samples(5)}
				if env.Quick {
					cfg.Size, cfg.Reuse = 64<<10, []int{1, 2}
				}
				rs, err := s.ZeroCopy(ctx, cfg)
				return rs, cfg, err
			}},
		{Name: "blocks", Command: "pinmem bench blocks", About: "scattered block copies by each strategy, against one contiguous copy and the C loop", Weight: 2,
			Run: blocksPart},
		{Name: "matrix", Command: "pinmem bench matrix", About: "every GPU alone and all at once, each way", Weight: 0.5,
			Run: func(ctx context.Context, s *Session, env SuiteEnv) ([]Result, any, error) {
				cfg := MatrixConfig{Samples: env.samples(5), Session: SessionConfig{Progress: env.Progress}} // every device
				if env.Quick {
					cfg.Size, cfg.Reps = 1<<20, 2
				}
				rs, _, err := Matrix(ctx, cfg)
				return rs, cfg, err
			}},
	}
}

// blocksPart is the suite's blocks test: each block size in a run of its
// own, with lists of DefaultBlocks blocks or of suiteListBytes, whichever
// is smaller, and the C loop beside each with --cref. Its configuration is
// the list of the runs'.
func blocksPart(ctx context.Context, s *Session, env SuiteEnv) ([]Result, any, error) {
	base := BlocksConfig{Samples: env.samples(5)}
	if env.Quick {
		base.Sizes, base.Blocks = []int64{16 << 10}, 16
	}
	base, err := base.Resolved()
	if err != nil {
		return nil, base, err
	}
	// Blocks are timed from the host, queuing included: a session
	// without spin-wait, as bench blocks opens.
	bs := s
	if env.Open != nil {
		if bs, err = env.Open(ctx, SessionConfig{NoSpin: true}); err != nil {
			return nil, base, err
		}
		defer bs.Close()
	}
	env.budgetRows(bs, len(base.Sizes)*len(base.Dirs)*len(base.Kinds))
	var rs []Result
	var cfgs []BlocksConfig
	for _, size := range base.Sizes {
		cfg := base
		cfg.Sizes = []int64{size}
		cfg.Blocks = int(min(int64(base.Blocks), max(suiteListBytes/size, 1)))
		cfgs = append(cfgs, cfg)
		got, err := bs.Blocks(ctx, cfg)
		rs = append(rs, got...)
		if err != nil {
			return rs, cfgs, err
		}
		if env.CRefDir != "" {
			args := []string{"--samples", strconv.Itoa(cfg.Samples), "--blocks", strconv.Itoa(cfg.Blocks), "--size", strconv.FormatInt(size, 10)}
			rs = append(rs, CRefRows(ctx, filepath.Join(env.CRefDir, "blocks"), args)...)
		}
	}
	return rs, cfgs, nil
}

// bwWithCRef measures cfg and, with env.CRefDir, the C reference's rows
// of crefKinds at the same sizes and directions, in the same run.
func bwWithCRef(ctx context.Context, s *Session, env SuiteEnv, cfg BandwidthConfig, crefKinds []string) ([]Result, any, error) {
	rs, err := s.Bandwidth(ctx, cfg)
	if err != nil || env.CRefDir == "" {
		return rs, cfg, err
	}
	cfg, _ = cfg.Resolved()
	args := []string{"--samples", strconv.Itoa(cfg.Samples), "--kinds", strings.Join(crefKinds, ","), "--dirs", "h2d,d2h"}
	for _, n := range cfg.Sizes {
		args = append(args, strconv.FormatInt(n, 10))
	}
	return append(rs, CRefRows(ctx, filepath.Join(env.CRefDir, "bw"), args)...), cfg, nil
}

// crefLine is one JSON line of a C reference program (cref/bw.c,
// cref/blocks.c).
type crefLine struct {
	Bench    string  `json:"bench"`
	Kind     string  `json:"kind"`
	Size     int64   `json:"size"`
	Dir      string  `json:"dir"`
	Unit     string  `json:"unit"`
	Samples  int     `json:"samples"`
	Median   float64 `json:"median"`
	Min      float64 `json:"min"`
	Max      float64 `json:"max"`
	Verified bool    `json:"verified"`
}

// CRefRows runs a C reference program with args and returns its lines as
// results of kind CRefPrefix+kind. A program that cannot run gives one
// skipped row saying why; its lines of other units are left out.
func CRefRows(ctx context.Context, bin string, args []string) []Result {
	name := filepath.Base(bin)
	var out bytes.Buffer
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	rs := ParseCRef(&out, "cref/"+name)
	if err != nil {
		why := strings.TrimSpace(stderr.String())
		if why == "" {
			why = err.Error()
		}
		rs = append(rs, skipped(name, CRefPrefix+name, "-", 0, GBps, "C reference "+bin+" "+strings.Join(args, " ")+": "+oneLine(why)))
	}
	return rs
}

// ParseCRef reads the JSON lines a C reference program prints (one
// measurement each, unit "gbps") as results of kind CRefPrefix+kind;
// lines that are not such measurements are left out.
func ParseCRef(r *bytes.Buffer, program string) []Result {
	var rs []Result
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var l crefLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Unit != "gbps" || l.Bench == "" || l.Kind == "" || l.Samples < 1 {
			continue
		}
		res := Result{Bench: l.Bench, Kind: CRefPrefix + l.Kind, Dir: l.Dir, Size: l.Size, Unit: GBps,
			Median: l.Median, Min: l.Min, Max: l.Max, Samples: l.Samples, Verified: l.Verified, Timing: TimingEvents,
			Note: fmt.Sprintf("C reference (%s, driver API)", program)}
		if l.Bench == "blocks" {
			res.Timing = TimingWall
		}
		if res.check() != nil {
			continue
		}
		rs = append(rs, res)
	}
	return rs
}

// ParseResultLines reads results printed one JSON object a line in the
// form of a result file's rows (docs/results/result.schema.json), as
// examples/imagepipeline/measure -json prints them. Blank lines are
// skipped; a line that is not such a row is an error matching ErrInvalid
// that names the line, returned with the rows before it.
func ParseResultLines(data []byte) ([]Result, error) {
	var rs []Result
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		var r Result
		if err := dec.Decode(&r); err != nil {
			return rs, invalid("line %d: not a result row: %s", i+1, oneLine(err.Error()))
		}
		if err := r.check(); err != nil {
			return rs, invalid("line %d (%s %s %s): %s", i+1, r.Bench, r.Kind, r.Dir, err)
		}
		rs = append(rs, r)
	}
	markFailures(rs)
	return rs, nil
}

// SelectParts returns the parts named in a comma-separated list, in run
// order ("" or "all": every part). An unknown name is an error matching
// ErrInvalid that lists the known ones.
func SelectParts(all []SuitePart, list string) ([]SuitePart, error) {
	list = strings.TrimSpace(list)
	if list == "" || list == "all" {
		return all, nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.ToLower(strings.TrimSpace(n))
		if n == "" {
			continue
		}
		known := false
		for _, p := range all {
			known = known || p.Name == n
		}
		if !known {
			var names []string
			for _, p := range all {
				names = append(names, p.Name)
			}
			return nil, invalid("unknown test %q (want %s, or all)", n, strings.Join(names, ", "))
		}
		want[n] = true
	}
	var out []SuitePart
	for _, p := range all {
		if want[p.Name] {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, invalid("empty test list")
	}
	return out, nil
}

// KindTorch is the load row of PyTorch's safetensors.torch.load_file of
// the same file (scripts/torch-load.py): the loader's reference.
const KindTorch = "torch"

// ParseTorchLoad reads what scripts/torch-load.py prints and returns its
// warm runs as a load row of kind KindTorch whose size is fileSize (the
// loader's rows', so that they pair up), or with fileSize 0 (a checkpoint)
// the tensor bytes the script reports. Output that is not the script's,
// or has no warm run, is an error.
func ParseTorchLoad(data []byte, fileSize int64) (Result, error) {
	var res struct {
		Bytes int64 `json:"bytes"`
		Runs  []struct {
			GBps float64 `json:"gbps"`
			Cold bool    `json:"cold"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		return Result{}, fmt.Errorf("unreadable output: %v", err)
	}
	var vals []float64
	for _, x := range res.Runs {
		if !x.Cold && x.GBps > 0 {
			vals = append(vals, x.GBps)
		}
	}
	s := Summarize(vals)
	if s.N == 0 {
		return Result{}, errors.New("no warm runs in its output")
	}
	if fileSize <= 0 {
		fileSize = res.Bytes // a checkpoint: its tensor bytes
	}
	return Result{Bench: "load", Kind: KindTorch, Dir: "warm", Size: fileSize, Unit: GBps, Timing: TimingWall,
		Median: s.Median, Min: s.Min, Max: s.Max, Samples: s.N,
		Note: fmt.Sprintf("safetensors.torch.load_file(device=cuda) of the same file, until torch.cuda.synchronize (scripts/torch-load.py); GB/s of its %d tensor bytes", res.Bytes)}, nil
}
