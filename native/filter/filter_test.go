package filter

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"
	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared/fake"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// These tests drive the adapter without Envoy through the few handle
// methods it uses (the e2e tests run it in real Envoy); they cover what
// Envoy cannot be made to do on purpose: a panic inside a callback.

// configHandle is the configuration handle's part the adapter uses.
type configHandle struct {
	shared.HttpFilterConfigHandle // nil: any other method panics
	ids                           idDefiner
	countingSink                  // the configuration's metrics in Envoy
	mu                            sync.Mutex
	logs                          []string
	scheduled                     int
}

func (h *configHandle) DefineCounter(name string, tags ...string) (shared.MetricID, shared.MetricsResult) {
	return h.ids.DefineCounter(name, tags...)
}

func (h *configHandle) DefineGauge(name string, tags ...string) (shared.MetricID, shared.MetricsResult) {
	return h.ids.DefineGauge(name, tags...)
}

func (h *configHandle) Log(_ shared.LogLevel, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.logs = append(h.logs, fmt.Sprintf(format, args...))
}

func (h *configHandle) GetScheduler() shared.Scheduler { return h }

// Schedule implements shared.Scheduler: the ticker's work is counted, not
// run (no main thread here).
func (h *configHandle) Schedule(func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.scheduled++
}

func (h *configHandle) id(name string) shared.MetricID {
	for i, n := range h.ids.names {
		if n == name {
			return shared.MetricID(i + 1)
		}
	}
	return 0
}

func (h *configHandle) log() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.logs, "\n")
}

// sinkOf is ConfigFactory.metricsFor in these tests: the fake handle's
// own counts.
func sinkOf(h shared.HttpFilterConfigHandle) (sink, error) {
	return &h.(*configHandle).countingSink, nil
}

// filterHandle is a stream's handle, the part the adapter uses.
type filterHandle struct {
	shared.HttpFilterHandle
	req, resp shared.HeaderMap
	continued int
}

func (h *filterHandle) RequestHeaders() shared.HeaderMap  { return h.req }
func (h *filterHandle) ResponseHeaders() shared.HeaderMap { return h.resp }
func (h *filterHandle) ContinueRequest()                  { h.continued++ }

// brokenHeaders panics when a header is read, as a fault in the SDK or in
// Envoy's answer could make it.
type brokenHeaders struct{ *fake.FakeHeaderMap }

func (brokenHeaders) GetOne(string) shared.UnsafeEnvoyBuffer { panic("header map broken") }

// envoyHeaders copies what it is given, as Envoy does (the engine lends
// response header values from a scratch buffer).
type envoyHeaders struct{ *fake.FakeHeaderMap }

func (h envoyHeaders) Add(k, v string) { h.FakeHeaderMap.Add(k, strings.Clone(v)) }

func newHeaders(m map[string][]string) envoyHeaders { return envoyHeaders{fake.NewFakeHeaderMap(m)} }

const demoConfig = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.02, "burst": 5}}]}`

func newConfig(t *testing.T, data string) (*configHandle, *filterConfig) {
	t.Helper()
	t.Setenv("GODEBUG", "cgocheck=0")
	ch := &configHandle{}
	f, err := ConfigFactory{metricsFor: sinkOf}.Create(ch, []byte(data))
	if err != nil {
		t.Fatalf("Create: %v\n%s", err, ch.log())
	}
	t.Cleanup(f.OnDestroy)
	return ch, f.(*filterConfig)
}

// TestPanicFailsOpen: a panic inside a filter callback does not reach
// Envoy: the request goes on, the panic is counted in tokenbucket.panics
// in Envoy and logged, the worker's lock is released
// and its engine replaced; the buckets, in the store, are intact.
func TestPanicFailsOpen(t *testing.T) {
	ch, c := newConfig(t, demoConfig)
	broken := &filterHandle{req: brokenHeaders{fake.NewFakeHeaderMap(nil)}, resp: newHeaders(nil)}
	f := c.Create(broken).(*httpFilter)
	w, before := f.w, f.w.e
	if st := f.OnRequestHeaders(broken.req, true); st != shared.HeadersStatusContinue {
		t.Fatalf("OnRequestHeaders after a panic = %d, want Continue", st)
	}
	if n := ch.counter(ch.id(Name + ".panics")); n != 1 {
		t.Fatalf("%s.panics = %d, want 1", Name, n)
	}
	if !strings.Contains(ch.log(), "panic in request headers") || !strings.Contains(ch.log(), "header map broken") {
		t.Fatalf("no log line for the panic:\n%s", ch.log())
	}
	if w.e == before {
		t.Fatal("the worker kept the engine the panic interrupted")
	}
	if !w.mu.TryLock() {
		t.Fatal("the worker's lock is still held")
	}
	w.mu.Unlock()
	f.OnStreamComplete()
	f.OnDestroy()

	// The next requests run on the new engine.
	for i := range 6 {
		h := &filterHandle{req: newHeaders(map[string][]string{"x-api-key": {"a"}}), resp: newHeaders(nil)}
		g := c.Create(h).(*httpFilter)
		if g.e != g.w.e {
			t.Fatal("a filter kept a replaced engine's request")
		}
		st := g.OnRequestHeaders(h.req, true)
		if i == 5 {
			break // the sixth is over the burst: a local reply, which this handle cannot send
		}
		g.OnResponseHeaders(h.resp, true)
		if st != shared.HeadersStatusContinue || h.resp.GetOne("ratelimit-remaining").ToString() != fmt.Sprint(4-i) {
			t.Fatalf("request %d: %d, remaining %q", i, st, h.resp.GetOne("ratelimit-remaining").ToString())
		}
		g.OnStreamComplete()
		g.OnDestroy()
	}
}

// TestCreateRefuses: without GODEBUG=cgocheck=0, and with a configuration
// the engine refuses, Create fails after logging the line that says why.
func TestCreateRefuses(t *testing.T) {
	t.Setenv("GODEBUG", "")
	ch := &configHandle{}
	if _, err := (ConfigFactory{}).Create(ch, []byte(demoConfig)); err == nil || !strings.Contains(ch.log(), "GODEBUG=cgocheck=0") {
		t.Fatalf("without GODEBUG: %v\n%s", err, ch.log())
	}
	t.Setenv("GODEBUG", "cgocheck=0")
	bad := `{"rules": [{"name": "r", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 5}}]}`
	want := engine.CheckConfiguration([]byte(bad))
	ch = &configHandle{}
	if _, err := (ConfigFactory{metricsFor: sinkOf}).Create(ch, []byte(bad)); err == nil || want == nil || !strings.Contains(ch.log(), want.Error()) {
		t.Fatalf("bad configuration: %v; log %q, want %q", err, ch.log(), want)
	}
}

// untouchableBody is a response body chunk that must not be read.
type untouchableBody struct{ shared.BodyBuffer }

func (untouchableBody) GetSize() uint64 { panic("the body was asked for its size") }

// TestBodyCallbacksOnlyForBodyCosts: with no rule taking its cost from the
// response body, the body and trailer callbacks ask Envoy nothing (each
// question is a crossing into Envoy) and leave the engine alone; with one,
// the body reaches the engine.
func TestBodyCallbacksOnlyForBodyCosts(t *testing.T) {
	ch, c := newConfig(t, demoConfig)
	h := &filterHandle{req: newHeaders(map[string][]string{"x-api-key": {"body"}}), resp: newHeaders(nil)}
	f := c.Create(h).(*httpFilter)
	f.OnRequestHeaders(h.req, true)
	f.OnResponseHeaders(h.resp, false)
	if st := f.OnResponseBody(untouchableBody{}, true); st != shared.BodyStatusContinue {
		t.Fatalf("OnResponseBody = %d, want Continue", st)
	}
	f.OnResponseTrailers(nil)
	if n := ch.counter(ch.id(Name + ".panics")); n != 0 {
		t.Fatalf("the body was read without a body cost (%d panics):\n%s", n, ch.log())
	}
	const bodyCost = `{"rules": [{"name": "tokens", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 10, "burst": 100, "cost_source": "response_json:usage.total_tokens"}}]}`
	if _, c := newConfig(t, bodyCost); !c.readsBody {
		t.Fatal("a configuration with a response body cost does not read bodies")
	}
}
