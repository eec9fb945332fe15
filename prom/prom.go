// Package prom exports pinmem's ledger of pinned host memory to Prometheus.
// It lives apart from package pinmem so that the core does not depend on
// the Prometheus client.
//
//	prometheus.MustRegister(prom.NewCollector())
package prom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinmem/pinmem"
)

// Collector is a prometheus.Collector reading pinmem.Stats at each scrape.
type Collector struct {
	stats func() pinmem.LedgerStats

	pinnedBytes, pinnedBuffers *prometheus.Desc
	peak, budget, reserved     *prometheus.Desc
	allocs, frees, allocBytes  *prometheus.Desc
	failures, rejections       *prometheus.Desc
	dropped                    *prometheus.Desc
	pinSeconds, unpinSeconds   *prometheus.Desc
	flagBytes                  *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a collector of the process's pinmem ledger. Metric
// names start with "pinmem_".
func NewCollector() *Collector { return newCollector(pinmem.Stats) }

func newCollector(stats func() pinmem.LedgerStats) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("pinmem_"+name, help, labels, nil)
	}
	return &Collector{
		stats:         stats,
		pinnedBytes:   d("pinned_bytes", "Host memory pinned by pinmem now, by kind (hostalloc, mmap-registered, go-registered).", "kind"),
		pinnedBuffers: d("pinned_buffers", "Pinned buffers live now, by kind.", "kind"),
		flagBytes:     d("pinned_bytes_by_flags", "Host memory pinned now, by the buffers' flags.", "flags"),
		peak:          d("pinned_peak_bytes", "Highest pinned total seen."),
		budget:        d("budget_bytes", "The pinned memory budget of the process."),
		reserved:      d("reserved_bytes", "Bytes charged to the budget now (pinned plus requests in flight)."),
		allocs:        d("allocs_total", "Successful pins (Alloc and Register)."),
		frees:         d("frees_total", "Buffers released with Free."),
		allocBytes:    d("alloc_bytes_total", "Bytes ever pinned."),
		failures:      d("alloc_failures_total", "Alloc and Register calls that failed, budget rejections included."),
		rejections:    d("budget_rejections_total", "Requests refused because of the budget."),
		dropped:       d("dropped_total", "Buffers that became unreachable without Free (still pinned)."),
		pinSeconds:    d("pin_seconds_total", "Time spent pinning."),
		unpinSeconds:  d("unpin_seconds_total", "Time spent releasing pinned memory."),
	}
}

// Describe sends the descriptors of every metric.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pinnedBytes, c.pinnedBuffers, c.flagBytes, c.peak, c.budget, c.reserved,
		c.allocs, c.frees, c.allocBytes, c.failures, c.rejections, c.dropped, c.pinSeconds, c.unpinSeconds} {
		ch <- d
	}
}

// Collect sends the current values.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ctr := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	for k := pinmem.Kind(0); int(k) < pinmem.NumKinds; k++ {
		u := s.ByKind[k]
		g(c.pinnedBytes, float64(u.Bytes), k.String())
		g(c.pinnedBuffers, float64(u.Buffers), k.String())
	}
	for f, u := range s.ByFlags {
		g(c.flagBytes, float64(u.Bytes), f.String())
	}
	g(c.peak, float64(s.PeakBytes))
	g(c.budget, float64(s.Budget))
	g(c.reserved, float64(s.Reserved))
	ctr(c.allocs, float64(s.Allocs))
	ctr(c.frees, float64(s.Frees))
	ctr(c.allocBytes, float64(s.AllocBytes))
	ctr(c.failures, float64(s.Failures))
	ctr(c.rejections, float64(s.BudgetRejections))
	ctr(c.dropped, float64(s.Dropped))
	ctr(c.pinSeconds, s.PinTime.Seconds())
	ctr(c.unpinSeconds, s.UnpinTime.Seconds())
}
