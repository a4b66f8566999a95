package filter

import (
	"testing"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"
)

// countingSink is a filter handle's metric calls, recorded.
type countingSink struct {
	counters map[shared.MetricID]uint64
	gauges   map[shared.MetricID]int64
}

func (s *countingSink) init() {
	if s.counters == nil {
		s.counters, s.gauges = map[shared.MetricID]uint64{}, map[shared.MetricID]int64{}
	}
}

func (s *countingSink) IncrementCounterValue(id shared.MetricID, v uint64, _ ...string) shared.MetricsResult {
	s.init()
	s.counters[id] += v
	return shared.MetricsSuccess
}

func (s *countingSink) IncrementGaugeValue(id shared.MetricID, v uint64, _ ...string) shared.MetricsResult {
	s.init()
	s.gauges[id] += int64(v)
	return shared.MetricsSuccess
}

func (s *countingSink) DecrementGaugeValue(id shared.MetricID, v uint64, _ ...string) shared.MetricsResult {
	s.init()
	s.gauges[id] -= int64(v)
	return shared.MetricsSuccess
}

// idDefiner gives metric ids in order of definition.
type idDefiner struct{ names []string }

func (d *idDefiner) DefineCounter(name string, _ ...string) (shared.MetricID, shared.MetricsResult) {
	d.names = append(d.names, name)
	return shared.MetricID(len(d.names)), shared.MetricsSuccess
}

func (d *idDefiner) DefineGauge(name string, _ ...string) (shared.MetricID, shared.MetricsResult) {
	return d.DefineCounter(name)
}

// TestMetricsPendingUntilCallback: increments with no filter callback in
// progress (the main thread) wait, and the next callback's handle flushes
// them once; increments inside a callback go through its handle at once.
func TestMetricsPendingUntilCallback(t *testing.T) {
	ms, d := newMetrics(), &idDefiner{}
	calls := ms.define(d, "tokenbucket.lease_calls", false)
	heap := ms.define(d, "tokenbucket.memory.heap_bytes", true)
	if again := ms.define(d, "tokenbucket.lease_calls", false); again != calls || len(d.names) != 2 {
		t.Fatalf("defining a name twice defined it again: %v", d.names)
	}
	w := &worker{}
	c, g := counter{ms: ms, m: calls, w: w}, gauge{ms: ms, m: heap, w: w}

	w.enterMain()
	c.Increment(2)
	c.Increment(3)
	g.Add(1000)
	g.Add(-400)
	w.exitMain()

	s := &countingSink{}
	h := w.enter(s)
	ms.flush(s)
	c.Increment(1) // inside the callback: at once
	w.exit(h)
	if s.counters[calls.id] != 6 || s.gauges[heap.id] != 600 {
		t.Fatalf("after the first callback: counter %d gauge %d, want 6 and 600", s.counters[calls.id], s.gauges[heap.id])
	}
	ms.flush(s) // nothing pending: nothing added
	if s.counters[calls.id] != 6 || s.gauges[heap.id] != 600 {
		t.Fatalf("a second flush added again: counter %d gauge %d", s.counters[calls.id], s.gauges[heap.id])
	}
	w.enterMain()
	g.Add(-700)
	w.exitMain()
	ms.flush(s)
	if s.gauges[heap.id] != -100 {
		t.Fatalf("gauge %d after a decrease on the main thread, want -100", s.gauges[heap.id])
	}
	if m := ms.lookup("tokenbucket.unknown"); m.gauge || m.pending.Load() != 0 {
		t.Fatal("an unknown name is not an inert metric")
	}
}
