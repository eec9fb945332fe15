// Package prom exports pinmem's figures to Prometheus: the process's
// ledger of pinned host memory (NewCollector) and the counters of a
// pool.Pool (NewPoolCollector). It lives apart from package pinmem so that
// the core does not depend on the Prometheus client. Nothing is registered
// on import:
//
//	prometheus.MustRegister(prom.NewCollector())
//	prometheus.MustRegister(prom.NewPoolCollector(p))
//
// Every metric name starts with "pinmem_". The collectors read the figures
// at each scrape and hold no state of their own.
package prom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/pool"
)

// ledgerCollector reads pinmem.Stats at each scrape.
type ledgerCollector struct {
	stats func() pinmem.LedgerStats

	pinnedBytes, pinnedBuffers *prometheus.Desc
	peak, budget, reserved     *prometheus.Desc
	allocs, frees, allocBytes  *prometheus.Desc
	failures, rejections       *prometheus.Desc
	dropped                    *prometheus.Desc
	pinSeconds, unpinSeconds   *prometheus.Desc
	flagBytes                  *prometheus.Desc
	objects, deviceBytes       *prometheus.Desc
}

// NewCollector returns a collector of the process's pinmem ledger
// (pinmem.Stats): pinned bytes and buffers by kind and by flags, the peak,
// the budget, counters of pins, frees, failures, budget rejections,
// dropped buffers and time spent pinning and unpinning, and the driver
// objects pinmem holds by kind (pinmem_driver_objects) with the device
// memory allocated (pinmem_device_bytes). The process has
// one ledger, so register one such collector per registry.
func NewCollector() prometheus.Collector { return newLedgerCollector(pinmem.Stats) }

func newLedgerCollector(stats func() pinmem.LedgerStats) *ledgerCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("pinmem_"+name, help, labels, nil)
	}
	return &ledgerCollector{
		stats:         stats,
		pinnedBytes:   d("pinned_bytes", "Host memory pinned by pinmem now, by kind (hostalloc, mmap-register, go-register).", "kind"),
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
		objects:       d("driver_objects", "Driver objects pinmem holds now, by kind (stream, event, module, context, device_alloc, host_alloc, registration).", "kind"),
		deviceBytes:   d("device_bytes", "Device memory pinmem holds allocated now."),
	}
}

func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pinnedBytes, c.pinnedBuffers, c.flagBytes, c.peak, c.budget, c.reserved,
		c.allocs, c.frees, c.allocBytes, c.failures, c.rejections, c.dropped, c.pinSeconds, c.unpinSeconds,
		c.objects, c.deviceBytes} {
		ch <- d
	}
}

func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
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
	o := s.Objects
	for _, kv := range []struct {
		kind string
		n    int64
	}{{"stream", o.Streams}, {"event", o.Events}, {"module", o.Modules}, {"context", o.Contexts},
		{"device_alloc", o.DeviceAllocs}, {"host_alloc", o.HostAllocs}, {"registration", o.Registrations}} {
		g(c.objects, float64(kv.n), kv.kind)
	}
	g(c.deviceBytes, float64(o.DeviceBytes))
}

// poolMetric is one figure of pool.Stats.
type poolMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(pool.Stats) float64
}

// poolCollector reads a pool's Stats at each scrape.
type poolCollector struct {
	stats   func() pool.Stats
	metrics []poolMetric
}

// NewPoolCollector returns a collector of p's Stats, labelled
// pool="<p.Stats().Name>": blocks and bytes in use, cached, pending and pinned,
// gets, hits, misses, puts, evictions, budget and release errors and time
// spent in the driver. Pool names need not be unique, but a registry refuses a second
// collector of the same name (Register returns a
// prometheus.AlreadyRegisteredError): give pools registered together
// distinct names with pool.WithName. Stats stay readable after Close, so
// the collector of a closed pool keeps reporting its last figures.
func NewPoolCollector(p *pool.Pool) prometheus.Collector {
	return newPoolCollector(p.Stats().Name, p.Stats)
}

func newPoolCollector(name string, stats func() pool.Stats) *poolCollector {
	labels := prometheus.Labels{"pool": name}
	m := func(metric, help string, kind prometheus.ValueType, value func(pool.Stats) float64) poolMetric {
		return poolMetric{prometheus.NewDesc("pinmem_pool_"+metric, help, nil, labels), kind, value}
	}
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	return &poolCollector{stats: stats, metrics: []poolMetric{
		m("gets_total", "Successful Get calls.", counter, func(s pool.Stats) float64 { return float64(s.Gets) }),
		m("hits_total", "Gets served from the cache.", counter, func(s pool.Stats) float64 { return float64(s.Hits) }),
		m("misses_total", "Gets that pinned new memory.", counter, func(s pool.Stats) float64 { return float64(s.Misses) }),
		m("puts_total", "Blocks given back with Put.", counter, func(s pool.Stats) float64 { return float64(s.Puts) }),
		m("evictions_total", "Idle blocks or slabs taken out of the cache to be unpinned.", counter, func(s pool.Stats) float64 { return float64(s.Evictions) }),
		m("budget_errors_total", "Gets that failed on the pinned memory budget.", counter, func(s pool.Stats) float64 { return float64(s.BudgetErrors) }),
		m("release_errors_total", "Unpinning calls that failed; the memory stays counted as pinned until a retry succeeds.", counter, func(s pool.Stats) float64 { return float64(s.ReleaseErrors) }),
		m("driver_seconds_total", "Time spent pinning, unpinning and in event calls.", counter, func(s pool.Stats) float64 { return s.DriverTime.Seconds() }),
		m("in_use_blocks", "Blocks taken by Get and not yet Put.", gauge, func(s pool.Stats) float64 { return float64(s.InUseBlocks) }),
		m("in_use_bytes", "Capacity of the blocks in use.", gauge, func(s pool.Stats) float64 { return float64(s.InUseBytes) }),
		m("requested_bytes", "Bytes requested by the Gets of the blocks in use.", gauge, func(s pool.Stats) float64 { return float64(s.RequestedBytes) }),
		m("cached_bytes", "Capacity of the idle blocks ready for reuse.", gauge, func(s pool.Stats) float64 { return float64(s.CachedBytes) }),
		m("pending_bytes", "Capacity of the blocks Put with stream work not yet seen to finish.", gauge, func(s pool.Stats) float64 { return float64(s.PendingBytes) }),
		m("pinned_bytes", "Host memory the pool holds pinned.", gauge, func(s pool.Stats) float64 { return float64(s.PinnedBytes) }),
		m("pinned_peak_bytes", "Highest pinned total of the pool.", gauge, func(s pool.Stats) float64 { return float64(s.PeakPinnedBytes) }),
	}}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	for _, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(s))
	}
}
