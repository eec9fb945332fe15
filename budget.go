package pinmem

import (
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/budgetspec"
	"github.com/pinmem/pinmem/internal/reclaim"
	"github.com/pinmem/pinmem/internal/sysinfo"
)

// EnvBudget names the environment variable that sets the default budget:
// bytes with an optional suffix (K, KiB, M, MiB, G, GiB, T, TiB are powers of
// 1024; KB, MB, GB, TB powers of 1000), or a percentage of
// physical memory such as "40%".
const EnvBudget = "PINMEM_BUDGET"

var (
	// reserved is every byte pinned or being pinned: the budget's measure.
	reserved atomic.Int64

	budgetMu      sync.Mutex
	budgetSet     int64 // from SetBudget; 0 when not set
	budgetDefault int64 // computed once; 0 when not yet computed
	budgetErr     error // PINMEM_BUDGET could not be parsed

	// physMem returns the base of percentages and of the default; a test hook.
	physMem = func() (uint64, error) { return sysinfo.PhysicalMemory() }
)

// SetBudget sets the process's pinned memory budget in bytes and returns
// the previous one. A limit <= 0 restores the default (PINMEM_BUDGET, or half
// of physical memory). Lowering the budget below what is already pinned
// frees nothing; it only makes later requests fail.
func SetBudget(limit int64) (prev int64) {
	prev = Budget()
	budgetMu.Lock()
	defer budgetMu.Unlock()
	if limit <= 0 {
		budgetSet = 0
		budgetDefault = 0 // read PINMEM_BUDGET again
		budgetErr = nil
	} else {
		budgetSet = limit
	}
	return prev
}

// Budget returns the process's pinned memory budget in bytes. Where
// physical memory cannot be read (not Linux) and PINMEM_BUDGET is unset, it
// is math.MaxInt64: no limit.
func Budget() int64 {
	b, _ := budget()
	return b
}

// budget returns the limit, or an error matching cuda.ErrInvalidValue when
// PINMEM_BUDGET is malformed (then the limit returned is the built-in default).
func budget() (int64, error) {
	budgetMu.Lock()
	defer budgetMu.Unlock()
	if budgetSet > 0 {
		return budgetSet, nil
	}
	if budgetDefault == 0 {
		budgetDefault, budgetErr = defaultBudget(os.Getenv(EnvBudget))
	}
	return budgetDefault, budgetErr
}

// defaultBudget computes the default from the value of PINMEM_BUDGET.
func defaultBudget(env string) (int64, error) {
	phys, physErr := physMem()
	half := int64(math.MaxInt64)
	if physErr == nil && phys > 0 {
		half = int64(min(phys/2, math.MaxInt64))
	}
	if strings.TrimSpace(env) == "" {
		return half, nil
	}
	var base uint64
	if physErr == nil {
		base = phys
	}
	n, err := budgetspec.Parse(env, base)
	if err != nil {
		return half, fmt.Errorf("pinmem: %s: %w", EnvBudget, err)
	}
	if strings.HasSuffix(strings.TrimSpace(env), "%") && (physErr != nil || phys == 0) {
		return half, fmt.Errorf("pinmem: %s=%q is a percentage but physical memory is unknown (%v): %w", EnvBudget, env, physErr, cuda.ErrInvalidValue)
	}
	return n, nil
}

// tryReserve adds n to reserved if that stays within limit.
func tryReserve(n, limit int64) (ok bool, cur int64) {
	for {
		cur = reserved.Load()
		if cur > limit-n {
			return false, cur
		}
		if reserved.CompareAndSwap(cur, cur+n) {
			return true, cur
		}
	}
}

// reserve takes n bytes of the budget, asking the reclaimers for memory
// when short. It returns the limit in force and the pinned total before the
// reservation, for error reports.
func reserve(n int64) (limit, before int64, err error) {
	limit, err = budget()
	if err != nil {
		return limit, reserved.Load(), err
	}
	if n > limit {
		ledgerRejected()
		return limit, reserved.Load(), &BudgetError{Requested: n, Pinned: reserved.Load(), Limit: limit}
	}
	ok, cur := tryReserve(n, limit)
	if ok {
		return limit, cur, nil
	}
	// Ask the caches; no lock is held while they run. Retry after each one
	// that freed something, so that no more is reclaimed than needed.
	for _, r := range reclaim.All() {
		want := reserved.Load() + n - limit
		if want <= 0 {
			want = n
		}
		if r.Reclaim(want) <= 0 {
			continue
		}
		if ok, cur = tryReserve(n, limit); ok {
			return limit, cur, nil
		}
	}
	if ok, cur = tryReserve(n, limit); ok {
		return limit, cur, nil
	}
	ledgerRejected()
	return limit, cur, &BudgetError{Requested: n, Pinned: cur, Limit: limit}
}

// unreserve gives n bytes back to the budget.
func unreserve(n int64) { reserved.Add(-n) }
