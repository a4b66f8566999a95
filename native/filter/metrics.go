package filter

import (
	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// Metrics. The module defines its metrics on the configuration when Envoy
// loads it (main thread) and changes them through Envoy's config-level
// calls (envoyabi.go), which any thread may make: an increment inside a
// filter callback, in the answer of a call the Plugin owns or in the tick
// (Envoy's main thread) shows in /stats at once. Nothing is kept pending.

// definer defines metrics (shared.HttpFilterConfigHandle).
type definer interface {
	DefineCounter(name string, tagKeys ...string) (shared.MetricID, shared.MetricsResult)
	DefineGauge(name string, tagKeys ...string) (shared.MetricID, shared.MetricsResult)
}

// sink changes the metrics of one configuration in Envoy; safe for
// concurrent use.
type sink interface {
	incrementCounter(id shared.MetricID, n uint64)
	incrementGauge(id shared.MetricID, n uint64)
	decrementGauge(id shared.MetricID, n uint64)
}

// metrics is one configuration's metrics by name. byName is written only
// while the configuration is created.
type metrics struct {
	byName map[string]*metric
	s      sink
}

type metric struct {
	id      shared.MetricID
	gauge   bool
	defined bool // false: a name Envoy refused or never defined, which counts nothing
}

func newMetrics(s sink) *metrics { return &metrics{byName: map[string]*metric{}, s: s} }

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
		return &metric{gauge: gauge}
	}
	m := &metric{id: id, gauge: gauge, defined: true}
	ms.byName[name] = m
	return m
}

// lookup is the metric defined as name, or one that counts nothing.
func (ms *metrics) lookup(name string) *metric {
	if m := ms.byName[name]; m != nil {
		return m
	}
	return &metric{}
}

// add adds n to m in Envoy, from any thread.
func (ms *metrics) add(m *metric, n int64) {
	switch {
	case !m.defined || n == 0:
	case !m.gauge:
		ms.s.incrementCounter(m.id, uint64(n))
	case n > 0:
		ms.s.incrementGauge(m.id, uint64(n))
	default:
		ms.s.decrementGauge(m.id, uint64(-n))
	}
}

// counter is engine.Counter.
type counter struct {
	ms *metrics
	m  *metric
}

func (c counter) Increment(n uint64) { c.ms.add(c.m, int64(n)) }

// gauge is engine.Gauge.
type gauge counter

func (g gauge) Add(n int64) { g.ms.add(g.m, n) }

var (
	_ engine.Counter = counter{}
	_ engine.Gauge   = gauge{}
)
