package engine_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// Concurrency rules of scope "cluster" (concurrency_cluster.go), on the
// fake host with a real limit service (service.Server, memory store, the
// host's clock).

const fleetStreams = `{"service": {"cluster": "limitd", "failure_mode": "%s"}, "rules": [
  {"name": "streams", "scope": "cluster", "limit_keys": ["header:t"], "algorithm": "concurrency",
   "algorithm_config": {"max_in_flight": 2, "ttl_ms": 3000}}%s]}`

func fleetStreamsCfg(failure, more string) string {
	return sprintf(sprintf(fleetStreams, failure), more)
}

// openServed starts a request and lets limitd answer its calls.
func (w *world) openServed(headers ...string) (*stream, *engine.Request) {
	s, r := w.open(headers...)
	w.limitd.serve(s)
	return s, r
}

// wentOn: the request went on (at once, or resumed after its calls).
func (s *stream) wentOn() bool {
	return s.Replied == 0 && (s.action == engine.Continue || s.Resumed == 1)
}

// TestClusterSlotsShareTheLimit: two in flight per tenant across the
// fleet: the third of a is refused with the concurrency reason while b
// passes, and an end gives its slot back in the limit service at once.
func TestClusterSlotsShareTheLimit(t *testing.T) {
	w := newWorld(t, fleetStreamsCfg("deny", "")).withLimitd()
	a1, r1 := w.openServed("t", "a")
	a2, _ := w.openServed("t", "a")
	if !a1.wentOn() || !a2.wentOn() {
		t.Fatalf("first two: %+v, %+v; want both to go on", a1, a2)
	}
	a3, _ := w.openServed("t", "a")
	if a3.Replied != 429 || !strings.Contains(string(a3.ReplyBody), reasonConcurrency) {
		t.Fatalf("third: %d %s; want 429 for %s", a3.Replied, string(a3.ReplyBody), reasonConcurrency)
	}
	if b, _ := w.openServed("t", "b"); !b.wentOn() {
		t.Fatalf("tenant b: %d, want it to go on", b.Replied)
	}
	if g := w.count("rule.streams.in_flight"); g != 3 {
		t.Fatalf("in_flight %d, want 3 (a1, a2, b)", g)
	}
	w.end(a1, r1)
	w.limitd.serve()
	if a4, _ := w.openServed("t", "a"); !a4.wentOn() {
		t.Fatalf("after an end: %d, want the freed slot", a4.Replied)
	}
}

// TestClusterSlotsEveryEndReleasesOnce: a request that ends while its
// acquire is on its way, one refused, one that went on: each gives back
// what it holds once, so the key ends with both slots free.
func TestClusterSlotsEveryEndReleasesOnce(t *testing.T) {
	w := newWorld(t, fleetStreamsCfg("deny", "")).withLimitd()
	// Ended before the acquire's answer: the answer is dropped (the host
	// drops a gone request's calls) and the release finds nothing.
	s, r := w.open("t", "a")
	if !s.paused() {
		t.Fatal("want the request to wait for its acquire")
	}
	w.end(s, r)
	w.limitd.serve()
	a1, r1 := w.openServed("t", "a")
	a2, r2 := w.openServed("t", "a")
	a3, r3 := w.openServed("t", "a")
	if !a1.wentOn() || !a2.wentOn() || a3.Replied != 429 {
		t.Fatalf("%d %d %d", a1.Replied, a2.Replied, a3.Replied)
	}
	for _, e := range []struct {
		s *stream
		r *engine.Request
	}{{a3, r3}, {a1, r1}, {a2, r2}, {a1, r1}} { // a1 twice: Done is idempotent
		w.end(e.s, e.r)
	}
	w.limitd.serve()
	if g := w.count("rule.streams.in_flight"); g != 0 {
		t.Fatalf("in_flight %d after every end, want 0", g)
	}
	b1, _ := w.openServed("t", "a")
	b2, _ := w.openServed("t", "a")
	if !b1.wentOn() || !b2.wentOn() {
		t.Fatalf("after every end: %d %d, want both slots free", b1.Replied, b2.Replied)
	}
}

// TestClusterSlotsRenewed: a request that runs for ten times its ttl keeps
// its slot while the plugin ticks (a renewal at least every ttl/3 + 1 s);
// a plugin that stops ticking (an Envoy gone) leaves its slots to end
// with their ttl, after which the key admits again.
func TestClusterSlotsRenewed(t *testing.T) {
	w := newWorld(t, fleetStreamsCfg("deny", "")).withLimitd()
	w.openServed("t", "a")
	w.openServed("t", "a")
	for range 30 {
		w.h.Clock.Advance(sec)
		w.tick()
	}
	if s, _ := w.openServed("t", "a"); s.Replied != 429 {
		t.Fatalf("after 30 s of renewals: %d, want 429 (both slots held)", s.Replied)
	}
	if lost := w.count("cluster_slots_lost"); lost != 0 {
		t.Fatalf("cluster_slots_lost %d, want 0", lost)
	}
	// No tick from here: the leases end 3 s after their last renewal.
	w.h.Clock.Advance(2 * sec)
	if s, _ := w.openServed("t", "a"); s.Replied != 429 {
		t.Fatalf("2 s without renewal: %d, want 429", s.Replied)
	}
	w.h.Clock.Advance(2 * sec)
	if s, _ := w.openServed("t", "a"); !s.wentOn() {
		t.Fatalf("4 s without renewal (ttl 3 s): %d, want the expired slot", s.Replied)
	}
}

// TestClusterSlotsFailureMode: limitd down: "allow" lets the request
// through without a slot (failed_open, service_errors), "deny" refuses it;
// either way the slot id is released (an acquire that timed out may have
// taken it).
func TestClusterSlotsFailureMode(t *testing.T) {
	for _, mode := range []string{"allow", "deny"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t, fleetStreamsCfg(mode, "")).withLimitd()
			w.limitd.down = true
			s, r := w.openServed("t", "a")
			switch {
			case mode == "allow" && (!s.wentOn() || w.count("rule.streams.failed_open") != 1):
				t.Fatalf("allow: %d, failed_open %d", s.Replied, w.count("rule.streams.failed_open"))
			case mode == "deny" && !strings.Contains(string(s.ReplyBody), reasonServiceDown):
				t.Fatalf("deny: %d %s", s.Replied, string(s.ReplyBody))
			}
			w.end(s, r)
			// The acquire failed, and so did the release that follows it
			// (an acquire that timed out may have taken its slot).
			if w.count("service_errors") != 2 {
				t.Fatalf("service_errors %d, want 2", w.count("service_errors"))
			}
			if g := w.count("rule.streams.in_flight"); g != 0 {
				t.Fatalf("in_flight %d, want 0", g)
			}
		})
	}
}

// TestClusterSlotsStackWithBuckets: a cluster token bucket beside the
// slots: the slots are taken first, so a refusal by the bucket gives the
// slot back, and a refusal by the slots sends no decision at all.
func TestClusterSlotsStackWithBuckets(t *testing.T) {
	bucketRule := `,
  {"name": "rate", "scope": "cluster", "limit_keys": ["header:t"], "algorithm": "token_bucket",
   "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}}`
	w := newWorld(t, fleetStreamsCfg("deny", bucketRule)).withLimitd()
	a1, _ := w.openServed("t", "a")
	if !a1.wentOn() || len(a1.Calls) != 2 {
		t.Fatalf("first: %d after %d calls, want it to go on after acquire and decide", a1.Replied, len(a1.Calls))
	}
	a2, _ := w.openServed("t", "a") // the bucket is empty: its slot goes back
	if a2.Replied != 429 || !strings.Contains(string(a2.ReplyBody), reasonExceeded) {
		t.Fatalf("second: %d %s, want the bucket's 429", a2.Replied, string(a2.ReplyBody))
	}
	w.limitd.serve()
	if g := w.count("rule.streams.in_flight"); g != 1 {
		t.Fatalf("in_flight %d, want 1", g)
	}
}

// TestClusterSlotsConfiguration: a max_in_flight above the limit
// service's bound is refused with its path.
func TestClusterSlotsConfiguration(t *testing.T) {
	for _, tt := range []struct{ cfg, want string }{
		{`{"service": {"cluster": "limitd"}, "rules": [{"name": "s", "scope": "cluster", "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 20000}}]}`,
			`rules[0].algorithm_config.max_in_flight: must be <= 10000`},
	} {
		if _, err := engine.Parse([]byte(tt.cfg), engine.Options{}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse: %v, want %q", err, tt.want)
		}
	}
}

// TestClusterSlotIDsDiffer: two Plugins configured at the same moment (two
// workers of one Envoy, whose clock reads alike) draw different slot ids:
// a shared id would let the second request count as holding the first's
// slot, admitting it without one.
func TestClusterSlotIDsDiffer(t *testing.T) {
	h := fakehost.New()
	p1, p2 := newPlugin(t, h, fleetStreamsCfg("deny", "")), newPlugin(t, h, fleetStreamsCfg("deny", ""))
	// The id each sends in its acquire call, as the limit service reads it.
	slotID := func(p *engine.Plugin) string {
		s := newStream("t", "a")
		if a := p.NewRequest(s).OnRequestHeaders(); a != engine.Pause || len(s.Calls) != 1 {
			t.Fatalf("action %v with %d calls; want a pause on the acquire call", a, len(s.Calls))
		}
		var req struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(s.Calls[0].Call.Body, &req); err != nil || req.ID == "" {
			t.Fatalf("acquire call %s: id %q, %v", s.Calls[0].Call.Body, req.ID, err)
		}
		return req.ID
	}
	if a, b := slotID(p1), slotID(p2); a == b {
		t.Fatalf("both Plugins drew %s", a)
	}
}

const shadowStreams = `,
  {"name": "watch", "mode": "shadow", "scope": "cluster", "limit_keys": ["header:t"], "algorithm": "concurrency",
   "algorithm_config": {"max_in_flight": 1, "ttl_ms": 3000}}`

// TestClusterSlotsShadow: a shadow cluster rule (one in flight) takes its
// slot from limitd but never refuses: of three requests held at once all
// go on (the enforced rule beside it has room for two, then refuses the
// third for itself), the shadow refusal is counted in shadow_rejected and
// holds nothing; the granted slot is renewed like an enforced one and
// released at Done, so the key admits again.
func TestClusterSlotsShadow(t *testing.T) {
	w := newWorld(t, fleetStreamsCfg("deny", shadowStreams)).withLimitd()
	a1, r1 := w.openServed("t", "a")
	a2, r2 := w.openServed("t", "a")
	if !a1.wentOn() || !a2.wentOn() {
		t.Fatalf("first two: %d, %d; want both to go on (the shadow rule never refuses)", a1.Replied, a2.Replied)
	}
	if n := w.count("rule.watch.shadow_rejected"); n != 1 {
		t.Fatalf("shadow_rejected %d, want 1 (the second request)", n)
	}
	if g := w.count("rule.watch.in_flight"); g != 1 {
		t.Fatalf("watch in_flight %d, want 1 (a refused shadow slot holds nothing)", g)
	}
	a3, r3 := w.openServed("t", "a")
	if a3.Replied != 429 || !strings.Contains(string(a3.ReplyBody), `"streams"`) {
		t.Fatalf("third: %d %s; want the enforced rule's 429", a3.Replied, string(a3.ReplyBody))
	}
	// The shadow slot outlives its ttl while the plugin ticks.
	for range 10 {
		w.h.Clock.Advance(sec)
		w.tick()
	}
	w.limitd.serve()
	if lost := w.count("cluster_slots_lost"); lost != 0 {
		t.Fatalf("cluster_slots_lost %d, want 0", lost)
	}
	w.end(a2, r2)
	w.end(a3, r3)
	w.limitd.serve()
	before := w.count("rule.watch.shadow_rejected")
	if b, _ := w.openServed("t", "a"); !b.wentOn() || w.count("rule.watch.shadow_rejected") != before+1 {
		t.Fatalf("a1's shadow slot still held: %d, shadow_rejected %d, want %d", b.Replied, w.count("rule.watch.shadow_rejected"), before+1)
	}
	w.end(a1, r1)
	w.limitd.serve()
	if b, _ := w.openServed("t", "b"); !b.wentOn() {
		t.Fatalf("tenant b: %d", b.Replied)
	}
	if c, _ := w.openServed("t", "c"); !c.wentOn() || w.count("rule.watch.shadow_rejected") != before+1 {
		t.Fatalf("after a1 ended: shadow_rejected %d, want %d (its slot released)", w.count("rule.watch.shadow_rejected"), before+1)
	}
}

// TestClusterSlotsShadowAlone: a shadow rule on its own, limitd up then
// down with failure_mode deny: every request goes on; a failed acquire
// counts in service_errors, never refuses, and its slot id is released.
func TestClusterSlotsShadowAlone(t *testing.T) {
	cfg := `{"service": {"cluster": "limitd", "failure_mode": "deny"}, "rules": [` + shadowStreams[1:] + `]}`
	w := newWorld(t, cfg).withLimitd()
	for i := range 3 {
		if s, _ := w.openServed("t", "a"); !s.wentOn() {
			t.Fatalf("request %d: %d, want it to go on", i, s.Replied)
		}
	}
	if n := w.count("rule.watch.shadow_rejected"); n != 2 {
		t.Fatalf("shadow_rejected %d, want 2", n)
	}
	w.limitd.down = true
	s, r := w.openServed("t", "b")
	if !s.wentOn() {
		t.Fatalf("limitd down: %d %s, want the request to go on", s.Replied, string(s.ReplyBody))
	}
	w.end(s, r)
	if e := w.count("service_errors"); e != 2 {
		t.Fatalf("service_errors %d, want 2 (the acquire and its release)", e)
	}
	if n := w.count("rule.watch.failed_open"); n != 0 {
		t.Fatalf("failed_open %d, want 0 (a shadow rule applies no failure_mode)", n)
	}
}

const patientFleet = `{"service": {"cluster": "limitd", "failure_mode": "deny"}, "rules": [
  {"name": "streams", "scope": "cluster", "limit_keys": ["header:t"], "algorithm": "concurrency",
   "algorithm_config": {"max_in_flight": 1, "ttl_ms": 3000, "max_delay_ms": 1000, "max_waiting": 1}}]}`

// retryDue is the moment of the request's one unfired retry, and whether
// it has one.
func retryDue(s *stream) (int64, bool) {
	var due int64
	n := 0
	for _, tm := range s.Timers {
		if !tm.Fired {
			due, n = tm.Due, n+1
		}
	}
	return due, n == 1
}

// TestClusterSlotsWait: max_delay_ms on a cluster rule: a request refused
// its slot waits, trying the acquire again 50 to 100 ms apart, and is
// admitted once a slot frees (with the delay header); a request past
// max_waiting is refused at once (waiting_full); one that finds no slot
// within its bound is refused there (delay_refused), after a bounded
// number of calls.
func TestClusterSlotsWait(t *testing.T) {
	w := newWorld(t, patientFleet).withLimitd()
	a1, r1 := w.openServed("t", "a")
	a2, r2 := w.openServed("t", "a")
	if !a1.wentOn() || !a2.paused() {
		t.Fatalf("first went on %v, second waits %v (%d %s); want both", a1.wentOn(), a2.paused(), a2.Replied, a2.ReplyBody)
	}
	if a3, _ := w.openServed("t", "a"); a3.Replied != 429 || w.count("rule.streams.waiting_full") != 1 {
		t.Fatalf("a third past max_waiting 1: %d, waiting_full %d; want 429 at once, 1", a3.Replied, w.count("rule.streams.waiting_full"))
	}
	for i := range 3 { // refused again: each retry 50 to 100 ms after the last
		due, ok := retryDue(a2)
		if now := w.h.Now(); !ok || due < now+50e6 || due > now+100e6 {
			t.Fatalf("retry %d due at now+%d ms (one pending: %v), want 50 to 100 ms", i, (due-now)/1e6, ok)
		}
		w.h.Clock.Set(due)
		a2.Fire(due)
		w.limitd.serve(a2)
		if !a2.paused() {
			t.Fatalf("retry %d: %d, want it to wait on", i, a2.Replied)
		}
	}
	w.end(a1, r1)
	w.limitd.serve()
	due, _ := retryDue(a2)
	w.h.Clock.Set(due)
	a2.Fire(due)
	w.limitd.serve(a2)
	if !a2.wentOn() || w.count("rule.streams.delayed") != 1 {
		t.Fatalf("after the end: %d, delayed %d; want admitted, 1", a2.Replied, w.count("rule.streams.delayed"))
	}
	w.respond(a2, r2, upstream{})
	if got := headerOf(a2.Added, engine.DelayHeader); got == "" {
		t.Fatalf("the waited request's response has no %s: %v", engine.DelayHeader, a2.Added)
	}
	// a2 holds the slot past a4's bound: a4 is refused there.
	a4, _ := w.openServed("t", "a")
	t0, calls := w.h.Now(), len(a4.Calls)
	for range 100 {
		due, ok := retryDue(a4)
		if !ok {
			break
		}
		w.h.Clock.Set(due)
		a4.Fire(due)
		w.limitd.serve(a4)
	}
	if a4.Replied != 429 || w.count("rule.streams.delay_refused") != 1 {
		t.Fatalf("no slot within the bound: %d, delay_refused %d; want 429, 1", a4.Replied, w.count("rule.streams.delay_refused"))
	}
	if waited := w.h.Now() - t0; waited != 1000e6 {
		t.Fatalf("refused after %d ms, want at its bound (1000 ms)", waited/1e6)
	}
	if n := len(a4.Calls) - calls; n < 10 || n > 20 {
		t.Fatalf("%d retries within 1 s, want 10 to 20 (every 50 to 100 ms)", n)
	}
}
