package filter

import (
	"sync/atomic"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// Metrics. Envoy's dynamic-module ABI defines metrics on the configuration
// (at configuration time, on the main thread) but increments them only
// through a filter's handle. So an increment made inside a filter callback
// goes through that callback's handle at once; one made with no filter
// callback in progress (the answer of a callout the Plugin owns, the tick:
// Envoy's main thread) is added to the metric's pending amount, and the
// next filter callback of the same configuration, on any worker, flushes
// every pending amount through its handle. A counter or gauge changed on
// the main thread therefore shows in /stats at the next request.

// definer defines metrics (shared.HttpFilterConfigHandle).
type definer interface {
	DefineCounter(name string, tagKeys ...string) (shared.MetricID, shared.MetricsResult)
	DefineGauge(name string, tagKeys ...string) (shared.MetricID, shared.MetricsResult)
}

// sink increments metrics (shared.HttpFilterHandle).
type sink interface {
	IncrementCounterValue(id shared.MetricID, value uint64, tagsValues ...string) shared.MetricsResult
	IncrementGaugeValue(id shared.MetricID, value uint64, tagsValues ...string) shared.MetricsResult
	DecrementGaugeValue(id shared.MetricID, value uint64, tagsValues ...string) shared.MetricsResult
}

// metrics is one configuration's metrics by name. byName and list are
// written only while the configuration is created.
type metrics struct {
	byName map[string]*metric
	list   []*metric
	dirty  atomic.Bool // some metric has a pending amount
}

type metric struct {
	id      shared.MetricID
	gauge   bool
	pending atomic.Int64
}

func newMetrics() *metrics { return &metrics{byName: map[string]*metric{}} }

// define defines name in Envoy (once). A name Envoy refuses gives a metric
// that counts nothing.
func (ms *metrics) define(d definer, name string, gauge bool) *metric {
	if m := ms.byName[name]; m != nil {
		return m
	}
	define := d.DefineCounter
	if gauge {
		define = d.DefineGauge
	}
	id, res := define(name)
	if res != shared.MetricsSuccess {
		return &metric{gauge: gauge} // not listed: never flushed
	}
	m := &metric{id: id, gauge: gauge}
	ms.byName[name] = m
	ms.list = append(ms.list, m)
	return m
}

// lookup is the metric defined as name, or one that counts nothing.
func (ms *metrics) lookup(name string) *metric {
	if m := ms.byName[name]; m != nil {
		return m
	}
	return &metric{}
}

// add adds n to m through s, or keeps it pending when s is nil.
func (ms *metrics) add(m *metric, s sink, n int64) {
	if s == nil {
		m.pending.Add(n)
		ms.dirty.Store(true)
		return
	}
	apply(s, m, n)
}

// flush moves every pending amount to Envoy through s.
func (ms *metrics) flush(s sink) {
	if !ms.dirty.CompareAndSwap(true, false) {
		return
	}
	for _, m := range ms.list {
		if n := m.pending.Swap(0); n != 0 {
			apply(s, m, n)
		}
	}
}

func apply(s sink, m *metric, n int64) {
	switch {
	case !m.gauge:
		s.IncrementCounterValue(m.id, uint64(n))
	case n >= 0:
		s.IncrementGaugeValue(m.id, uint64(n))
	default:
		s.DecrementGaugeValue(m.id, uint64(-n))
	}
}

// counter is engine.Counter for one worker's Plugin.
type counter struct {
	ms *metrics
	m  *metric
	w  *worker // nil for the Plugin built to check the configuration
}

func (c counter) Increment(n uint64) { c.ms.add(c.m, c.w.sinkOrNil(), int64(n)) }

// gauge is engine.Gauge for one worker's Plugin.
type gauge counter

func (g gauge) Add(n int64) { g.ms.add(g.m, g.w.sinkOrNil(), n) }

// sinkOrNil is the handle of the filter callback in progress on w (called
// with w held), or nil.
func (w *worker) sinkOrNil() sink {
	if w == nil {
		return nil
	}
	return w.sink
}

var (
	_ engine.Counter = counter{}
	_ engine.Gauge   = gauge{}
)
