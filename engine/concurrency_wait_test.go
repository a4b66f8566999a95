package engine_test

import (
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// Waiting for a slot (max_delay_ms on a concurrency rule, concurrency.go).

const patientStreams = `{"rules": [{"name": "streams", "limit_keys": ["header:t"], "algorithm": "concurrency",
  "algorithm_config": {"max_in_flight": 1, "max_delay_ms": 1000%s}}]}`

// waiting: the request was paused, neither answered nor resumed.
func waiting(h held) bool { return h.s.paused() }

// admitted: the request went on (at once, or resumed after a wait).
func admitted(h held) bool {
	return h.s.Replied == 0 && (h.s.action == engine.Continue || h.s.Resumed == 1)
}

// TestSlotWaitFirstComeFirstServed: one slot; three requests wait in the
// order they came, a fourth that arrives later joins the line rather than
// take the slot an end frees, and each end admits the next at once.
func TestSlotWaitFirstComeFirstServed(t *testing.T) {
	w := newWorld(t, sprintf(patientStreams, ""))
	hs := w.openN(3, "t", "a")
	if !admitted(hs[0]) || !waiting(hs[1]) || !waiting(hs[2]) {
		t.Fatalf("first admitted, two waiting: %+v %+v %+v", hs[0].s, hs[1].s, hs[2].s)
	}
	if n := w.count("rule.streams.waiting"); n != 2 {
		t.Fatalf("waiting %d, want 2", n)
	}
	w.h.Clock.Advance(100e6)
	w.end(hs[0].s, hs[0].r) // the slot goes to the first in line, at once
	if !admitted(hs[1]) || !waiting(hs[2]) {
		t.Fatalf("after the first end: second admitted %v, third waiting %v", admitted(hs[1]), waiting(hs[2]))
	}
	late := w.openN(1, "t", "a")[0]
	if !waiting(late) {
		t.Fatalf("a late request: %+v, want it to wait behind the third", late.s)
	}
	w.end(hs[1].s, hs[1].r)
	if !admitted(hs[2]) || !waiting(late) {
		t.Fatalf("after the second end: third admitted %v, late waiting %v", admitted(hs[2]), waiting(late))
	}
	w.end(hs[2].s, hs[2].r)
	if !admitted(late) {
		t.Fatal("after the third end: the late request still waits")
	}
	w.respond(late.s, late.r, upstream{})
	if got := headerOf(late.s.Added, engine.DelayHeader); got == "" {
		t.Fatalf("the waited request's response has no %s: %v", engine.DelayHeader, late.s.Added)
	}
	w.end(late.s, late.r)
	if d, wt, f := w.count("rule.streams.delayed"), w.count("rule.streams.waiting"), w.count("rule.streams.in_flight"); d != 3 || wt != 0 || f != 0 {
		t.Fatalf("delayed %d, waiting %d, in_flight %d; want 3, 0, 0", d, wt, f)
	}
	if n := w.freeSlots("a"); n != 1 {
		t.Fatalf("%d free at the end, want 1", n)
	}
}

// TestSlotWaitBound: no slot within max_delay_ms: the request is refused
// at its bound, with the concurrency reason; the polls before it find none.
func TestSlotWaitBound(t *testing.T) {
	w := newWorld(t, sprintf(patientStreams, ""))
	first := w.openN(1, "t", "a")[0]
	second := w.openN(1, "t", "a")[0]
	t0 := w.h.Now()
	for w.h.Now() < t0+999e6 {
		w.h.Clock.Advance(20e6)
		second.s.Fire(w.h.Now())
		if w.h.Now() < t0+1000e6 && !waiting(second) {
			t.Fatalf("at t0+%dms: no longer waiting", (w.h.Now()-t0)/1e6)
		}
	}
	w.h.Clock.Set(t0 + 1000e6)
	second.s.Fire(w.h.Now())
	if second.s.Replied != 429 || headerOf(second.s.ReplyHeaders, "x-ratelimit-reason") != reasonConcurrency {
		t.Fatalf("at the bound: replied %d %v, want 429 %s", second.s.Replied, second.s.ReplyHeaders, reasonConcurrency)
	}
	if r, wt := w.count("rule.streams.delay_refused"), w.count("rule.streams.waiting"); r != 1 || wt != 0 {
		t.Fatalf("delay_refused %d, waiting %d; want 1, 0", r, wt)
	}
	w.end(second.s, second.r)
	w.end(first.s, first.r)
	if n := w.freeSlots("a"); n != 1 {
		t.Fatalf("%d free at the end, want 1", n)
	}
}

// TestSlotWaitAbandoned: a waiting request that ends (the client left) or
// that Envoy answers (a timeout) leaves the line, counted, and takes no
// slot; max_waiting bounds the line.
func TestSlotWaitAbandoned(t *testing.T) {
	w := newWorld(t, sprintf(patientStreams, `, "max_waiting": 2`))
	first := w.openN(1, "t", "a")[0]
	gone, answered := w.openN(1, "t", "a")[0], w.openN(1, "t", "a")[0]
	full := w.openN(1, "t", "a")[0]
	if !waiting(gone) || !waiting(answered) || full.s.Replied != 429 {
		t.Fatalf("two waiting, the third refused: %v %v %d", waiting(gone), waiting(answered), full.s.Replied)
	}
	if n := w.count("rule.streams.waiting_full"); n != 1 {
		t.Fatalf("waiting_full %d, want 1", n)
	}
	w.end(gone.s, gone.r)                                 // the client left
	answered.s.Resp = map[string]string{":status": "504"} // Envoy's own answer
	answered.r.OnResponseHeaders(true)
	w.end(answered.s, answered.r)
	if a, wt := w.count("rule.streams.delay_abandoned"), w.count("rule.streams.waiting"); a != 2 || wt != 0 {
		t.Fatalf("delay_abandoned %d, waiting %d; want 2, 0", a, wt)
	}
	w.end(full.s, full.r)
	w.end(first.s, first.r)
	if n, f := w.freeSlots("a"), w.count("rule.streams.in_flight"); n != 1 || f != 0 {
		t.Fatalf("%d free, in_flight %d at the end; want 1, 0", n, f)
	}
}

// TestSlotWaitAcrossWorkers: a slot freed by another worker (another
// Plugin on the same shared data) is found by the waiting request's poll.
func TestSlotWaitAcrossWorkers(t *testing.T) {
	h := fakehost.New()
	w1 := newWorldOn(t, h, sprintf(patientStreams, ""))
	w2 := newWorldOn(t, h, sprintf(patientStreams, ""))
	first := w1.openN(1, "t", "a")[0]
	second := w2.openN(1, "t", "a")[0]
	if !admitted(first) || !waiting(second) {
		t.Fatalf("admitted %v, waiting %v", admitted(first), waiting(second))
	}
	h.Clock.Advance(5e6)
	w1.end(first.s, first.r)
	if !waiting(second) {
		t.Fatal("woken by another worker's end: shared data has no notification")
	}
	h.Clock.Advance(20e6)
	second.s.Fire(h.Now())
	if !admitted(second) {
		t.Fatal("the poll after the other worker's end did not admit it")
	}
	w2.end(second.s, second.r)
	if n := w1.freeSlots("a"); n != 1 {
		t.Fatalf("%d free at the end, want 1", n)
	}
}

// TestSlotWaitStacked: a request a token bucket refuses does not wait for
// a slot; one that waits takes its token when it gets its slot, not before.
func TestSlotWaitStacked(t *testing.T) {
	cfg := `{"rules": [
  {"name": "streams", "limit_keys": ["header:t"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1, "max_delay_ms": 1000}},
  {"name": "rate", "limit_keys": ["header:t"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 2}}]}`
	w := newWorld(t, cfg)
	first := w.openN(1, "t", "a")[0]
	second := w.openN(1, "t", "a")[0] // waits: its token is not taken
	if !admitted(first) || !waiting(second) {
		t.Fatalf("admitted %v, waiting %v", admitted(first), waiting(second))
	}
	w.end(first.s, first.r)
	if !admitted(second) {
		t.Fatal("second not admitted after the end")
	}
	w.end(second.s, second.r)
	third := w.do("t", "a") // the bucket is empty: refused at once, no wait
	if third.status != 429 || third.headers["x-ratelimit-reason"] != reasonExceeded || w.count("rule.streams.waiting") != 0 {
		t.Fatalf("third: %d %v, waiting %d; want a token bucket refusal", third.status, third.headers, w.count("rule.streams.waiting"))
	}
}

// TestSlotWaitWokenByRefusal: a request that took the slot and is then
// refused by a cluster rule gives the slot back, and the first waiting in
// its worker takes it at once.
func TestSlotWaitWokenByRefusal(t *testing.T) {
	cfg := `{"service": {"cluster": "limitd", "failure_mode": "deny"}, "rules": [
  {"name": "streams", "limit_keys": ["header:t"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1, "max_delay_ms": 1000}},
  {"name": "fleet", "scope": "cluster", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 9}}]}`
	w := newWorld(t, cfg).withLimitd()
	first := w.openN(1, "t", "a")[0] // its slot taken, its cluster call out
	second := w.openN(1, "t", "a")[0]
	if len(first.s.Calls) != 1 || !waiting(second) || len(second.s.Calls) != 0 {
		t.Fatalf("first: %d calls; second waiting %v with %d calls", len(first.s.Calls), waiting(second), len(second.s.Calls))
	}
	w.limitd.down = true
	w.limitd.serve(first.s) // the limit service fails: failure_mode deny refuses the first
	if first.s.Replied != 429 {
		t.Fatalf("first: replied %d, want 429", first.s.Replied)
	}
	if len(second.s.Calls) != 1 {
		t.Fatalf("second: %d calls, want its cluster call sent at once (it took the slot given back)", len(second.s.Calls))
	}
	w.limitd.down = false
	w.limitd.serve(second.s)
	if !admitted(second) {
		t.Fatalf("second not admitted: %+v", second.s)
	}
	w.end(first.s, first.r)
	w.end(second.s, second.r)
	if n := w.count("rule.streams.in_flight"); n != 0 {
		t.Fatalf("in_flight %d, want 0", n)
	}
}
