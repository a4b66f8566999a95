package filter

import (
	"runtime"
	"sync"
	"testing"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"
)

// countingSink is the metrics of one configuration in Envoy, recorded; safe
// for concurrent use as Envoy's are.
type countingSink struct {
	mu       sync.Mutex
	counters map[shared.MetricID]uint64
	gauges   map[shared.MetricID]int64
}

func (s *countingSink) change(id shared.MetricID, counter uint64, gauge int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counters == nil {
		s.counters, s.gauges = map[shared.MetricID]uint64{}, map[shared.MetricID]int64{}
	}
	s.counters[id] += counter
	s.gauges[id] += gauge
}

func (s *countingSink) incrementCounter(id shared.MetricID, n uint64) { s.change(id, n, 0) }
func (s *countingSink) incrementGauge(id shared.MetricID, n uint64)   { s.change(id, 0, int64(n)) }
func (s *countingSink) decrementGauge(id shared.MetricID, n uint64)   { s.change(id, 0, -int64(n)) }

func (s *countingSink) counter(id shared.MetricID) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counters[id]
}

func (s *countingSink) gauge(id shared.MetricID) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gauges[id]
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

// TestMetricsNeverPending: a metric changed with no filter callback in
// progress (Envoy's main thread: the answer of a call the Plugin owns, the
// tick) reaches Envoy at once, through the configuration. Before, such
// changes waited for the next request's callback, and with no request
// after them (the answers of a shadow cluster rule's calls) never showed.
func TestMetricsNeverPending(t *testing.T) {
	s, d := &countingSink{}, &idDefiner{}
	ms := newMetrics(s)
	calls := ms.define(d, "tokenbucket.lease_calls", false)
	heap := ms.define(d, "tokenbucket.memory.heap_bytes", true)
	if again := ms.define(d, "tokenbucket.lease_calls", false); again != calls || len(d.names) != 2 {
		t.Fatalf("defining a name twice defined it again: %v", d.names)
	}
	w := &worker{}
	c, g := counter{ms: ms, m: calls}, gauge{ms: ms, m: heap}
	w.enterMain()
	c.Increment(2)
	c.Increment(3)
	g.Add(1000)
	g.Add(-400)
	w.exitMain()
	if s.counter(calls.id) != 5 || s.gauge(heap.id) != 600 {
		t.Fatalf("after the main thread's changes: counter %d gauge %d, want 5 and 600 at once", s.counter(calls.id), s.gauge(heap.id))
	}
	if m := ms.lookup("tokenbucket.unknown"); m.defined {
		t.Fatal("an unknown name is not an inert metric")
	}
	ms.add(ms.lookup("tokenbucket.unknown"), 1) // counts nothing, calls nothing
}

// TestTickCountsAtOnce: the engine's tick, run on the main thread with no
// request before or after it, shows the memory gauges in Envoy at once.
func TestTickCountsAtOnce(t *testing.T) {
	ch, c := newConfig(t, demoConfig)
	remaining(t, c, "tick") // a worker, so that there is a Plugin to tick
	var ms runtime.MemStats
	readMemory(&ms)
	c.tick(&ms)
	if n := ch.gauge(ch.id(Name + ".memory.heap_bytes")); n <= 0 {
		t.Fatalf("%s.memory.heap_bytes = %d after a tick with no request after it, want the heap's size", Name, n)
	}
}
