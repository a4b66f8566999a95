package engine_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

// Concurrency rules (concurrency.go): slots taken at admission, given back
// once at Done, however the stream ends.

const streams = `{"rules": [{"name": "streams", "limit_keys": ["header:t"], "algorithm": "concurrency",
  "algorithm_config": {"max_in_flight": 2}%s}]}`

func streamsCfg(extra string) string { return sprintf(streams, extra) }

// freeSlots counts the requests of tenant a key admits now, and ends them:
// the slots the key has free.
func (w *world) freeSlots(tenant string) int {
	w.t.Helper()
	var open []held
	for range 100 {
		s, r := w.open("t", tenant)
		if s.Replied != 0 || s.paused() { // refused, or waiting for a slot
			w.end(s, r)
			break
		}
		open = append(open, held{s, r})
	}
	for _, h := range open {
		w.end(h.s, h.r)
	}
	return len(open)
}

// TestConcurrencyRefusesTheThird: two in flight per tenant; the third of a
// is refused with the concurrency reason, a Retry-After of 1 or 2 and the
// slots in the RateLimit headers, while b passes; an end frees a slot.
func TestConcurrencyRefusesTheThird(t *testing.T) {
	w := newWorld(t, streamsCfg(""))
	a1, r1 := w.open("t", "a")
	a2, r2 := w.open("t", "a")
	if a1.action != engine.Continue || a2.action != engine.Continue {
		t.Fatalf("first two: %v, %v; want both to go on", a1.action, a2.action)
	}
	got := w.do("t", "a")
	if got.status != 429 || got.headers["x-ratelimit-reason"] != reasonConcurrency {
		t.Fatalf("third: %d %v; want 429 for %s", got.status, got.headers, reasonConcurrency)
	}
	if ra := got.headers["retry-after"]; ra != "1" && ra != "2" {
		t.Fatalf("Retry-After %q, want 1 or 2", ra)
	}
	if got.headers["ratelimit-policy"] != `"streams";q=2` || got.headers["ratelimit"] != `"streams";r=0;t=1` {
		t.Fatalf("RateLimit headers %q, %q", got.headers["ratelimit-policy"], got.headers["ratelimit"])
	}
	if !strings.Contains(got.body, `"reason":"concurrency_limit_exceeded"`) {
		t.Fatalf("body %s", got.body)
	}
	b := w.do("t", "b")
	if b.status != 200 || b.headers["ratelimit"] != `"streams";r=1;t=0` {
		t.Fatalf("tenant b: %d, %q; want 200 with one slot left while it ran", b.status, b.headers["ratelimit"])
	}
	if n := w.count("rule.streams.in_flight"); n != 2 {
		t.Fatalf("in_flight %d, want 2", n)
	}
	w.respond(a1, r1, upstream{})
	w.end(a1, r1)
	if n := w.freeSlots("a"); n != 1 {
		t.Fatalf("after one end, %d free, want 1", n)
	}
	w.end(a2, r2)
	if n, rej := w.count("rule.streams.in_flight"), w.count("rule.streams.rejected"); n != 0 || rej != 2 {
		t.Fatalf("in_flight %d, rejected %d; want 0, 2", n, rej)
	}
}

// TestConcurrencyEveryEndReleasesOnce: however a request ends, its slot
// comes back once. A witness request holds the other slot, so a slot given
// back twice would show as two free (the bucket clamps at max_in_flight).
func TestConcurrencyEveryEndReleasesOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(w *world, s *stream, r *engine.Request)
	}{
		{"response complete", func(w *world, s *stream, r *engine.Request) {
			w.respond(s, r, upstream{chunks: []string{"ok"}})
			w.end(s, r)
		}},
		{"client reset before the response", func(w *world, s *stream, r *engine.Request) { w.end(s, r) }},
		{"reset in the body (client or upstream)", func(w *world, s *stream, r *engine.Request) {
			w.respond(s, r, upstream{chunks: []string{"par"}, cut: true})
			w.end(s, r)
		}},
		{"route timeout (Envoy's 504)", func(w *world, s *stream, r *engine.Request) {
			w.respond(s, r, upstream{status: "504", chunks: []string{"upstream request timeout"}})
			w.end(s, r)
		}},
		{"a later filter's local reply", func(w *world, s *stream, r *engine.Request) {
			w.respond(s, r, upstream{status: "403"})
			w.end(s, r)
		}},
		{"trailers", func(w *world, s *stream, r *engine.Request) {
			w.respond(s, r, upstream{chunks: []string{"a"}, trailers: true})
			w.end(s, r)
		}},
		{"Done twice (a host that calls it again)", func(w *world, s *stream, r *engine.Request) {
			w.end(s, r)
			r.Done()
		}},
		{"reload: the old Plugin's request ends after the new one starts", func(w *world, s *stream, r *engine.Request) {
			w.p = newPlugin(w.t, w.h, streamsCfg(""))
			w.end(s, r)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, streamsCfg(""))
			witness, wr := w.open("t", "a")
			s, r := w.open("t", "a")
			if witness.action != engine.Continue || s.action != engine.Continue {
				t.Fatalf("actions %v, %v", witness.action, s.action)
			}
			tc.end(w, s, r)
			if n := w.freeSlots("a"); n != 1 {
				t.Fatalf("free slots with the witness in flight: %d, want 1", n)
			}
			w.end(witness, wr)
			if n := w.freeSlots("a"); n != 2 {
				t.Fatalf("free slots at the end: %d, want 2", n)
			}
			if n := w.count("rule.streams.in_flight"); n != 0 {
				t.Fatalf("in_flight %d, want 0", n)
			}
		})
	}
}

// TestConcurrencyReloadWithAnotherLimit: a reload that changes
// max_in_flight starts a table of its own; the requests admitted before it
// give back to the old table and never to the new one.
func TestConcurrencyReloadWithAnotherLimit(t *testing.T) {
	w := newWorld(t, streamsCfg(""))
	old := w.openN(2, "t", "a")
	w.p = newPlugin(t, w.h, strings.Replace(streamsCfg(""), `"max_in_flight": 2`, `"max_in_flight": 3`, 1))
	now := w.openN(2, "t", "a")
	for _, h := range old {
		w.end(h.s, h.r)
	}
	if n := w.freeSlots("a"); n != 1 {
		t.Fatalf("new table: %d free with 2 of 3 in flight, want 1", n)
	}
	for _, h := range now {
		w.end(h.s, h.r)
	}
	if n := w.freeSlots("a"); n != 3 {
		t.Fatalf("new table: %d free, want 3", n)
	}
}

// TestConcurrencyStacksAllOrNone: with a token bucket beside it, a refusal
// by either takes nothing of the other.
func TestConcurrencyStacksAllOrNone(t *testing.T) {
	cfg := `{"rules": [
  {"name": "streams", "limit_keys": ["header:t"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1}},
  {"name": "rate", "limit_keys": ["header:t"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 2}}]}`
	w := newWorld(t, cfg)
	s1, r1 := w.open("t", "a") // a slot and a token
	if s1.action != engine.Continue {
		t.Fatalf("first: %v", s1.action)
	}
	// The slot refuses: the token bucket keeps its token.
	if got := w.do("t", "a"); got.headers["x-ratelimit-reason"] != reasonConcurrency {
		t.Fatalf("second: %d %v, want a concurrency refusal", got.status, got.headers)
	}
	w.end(s1, r1)
	s2, r2 := w.open("t", "a") // the last token
	if s2.action != engine.Continue {
		t.Fatalf("third: %v; the refused request took a token", s2.action)
	}
	w.end(s2, r2)
	// The bucket refuses: no slot stays taken.
	if got := w.do("t", "a"); got.headers["x-ratelimit-reason"] != reasonExceeded {
		t.Fatalf("fourth: %d %v, want a token bucket refusal", got.status, got.headers)
	}
	if n := w.count("rule.streams.in_flight"); n != 0 {
		t.Fatalf("in_flight %d after the bucket refused, want 0", n)
	}
}

// TestConcurrencyShadowAndMatch: a shadow rule refuses nothing, counts what
// it would refuse and gives its slots back; match and tiers choose which
// rule's slots a request takes.
func TestConcurrencyShadowAndMatch(t *testing.T) {
	cfg := `{"rules": [
  {"name": "watch", "mode": "shadow", "limit_keys": ["header:t"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1}},
  {"name": "gold", "group": "tier", "match": {"header:plan": {"equals": "gold"}}, "limit_keys": ["header:t"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 3}},
  {"name": "free", "group": "tier", "limit_keys": ["header:t"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1}}]}`
	w := newWorld(t, cfg)
	gold := w.openN(3, "t", "g", "plan", "gold")
	free := w.openN(2, "t", "f")
	for i, h := range gold {
		if h.s.action != engine.Continue {
			t.Fatalf("gold %d: %v", i, h.s.action)
		}
	}
	if free[0].s.action != engine.Continue || free[1].s.Replied != 429 {
		t.Fatalf("free: %v, %d; want the second refused", free[0].s.action, free[1].s.Replied)
	}
	if n := w.count("rule.watch.shadow_rejected"); n != 3 { // gold 2 and 3, free 2
		t.Fatalf("shadow_rejected %d, want 3", n)
	}
	if g, f, s := w.count("rule.gold.in_flight"), w.count("rule.free.in_flight"), w.count("rule.watch.in_flight"); g != 3 || f != 1 || s != 2 {
		t.Fatalf("in_flight gold %d, free %d, watch %d; want 3, 1, 2", g, f, s)
	}
	for _, h := range append(gold, free...) {
		w.end(h.s, h.r)
	}
	if g, f, s := w.count("rule.gold.in_flight"), w.count("rule.free.in_flight"), w.count("rule.watch.in_flight"); g != 0 || f != 0 || s != 0 {
		t.Fatalf("in_flight gold %d, free %d, watch %d at the end; want 0", g, f, s)
	}
	if got := w.do("t", "f"); got.status != 200 {
		t.Fatalf("after the end: %d, want the shadow slot back", got.status)
	}
}

// TestConcurrencyReleaseOwedWhenSharedDataFails: a release whose write
// fails is owed and written by the next tick, never lost nor doubled.
func TestConcurrencyReleaseOwedWhenSharedDataFails(t *testing.T) {
	h := fakehost.New()
	fd := &fakehost.RefusingData{SD: shareddata.New()}
	h.SD = fd
	w := newWorldOn(t, h, streamsCfg(""))
	witness, wr := w.open("t", "a")
	s, r := w.open("t", "a")
	fd.Refuse, fd.Err = -1, errors.New("shared data: out of memory")
	w.end(s, r)
	fd.Refuse = 0
	if n := engine.SlotsOwed(w.p); n != 1 {
		t.Fatalf("owed %d, want 1", n)
	}
	if n := w.freeSlots("a"); n != 0 {
		t.Fatalf("before the tick: %d free, want 0 (the release is owed)", n)
	}
	w.tick()
	if n := w.freeSlots("a"); n != 1 || engine.SlotsOwed(w.p) != 0 {
		t.Fatalf("after the tick: %d free, %d owed; want 1, 0", n, engine.SlotsOwed(w.p))
	}
	w.end(witness, wr)
	if n := w.freeSlots("a"); n != 2 {
		t.Fatalf("at the end: %d free, want 2", n)
	}
}

// BenchmarkConcurrencyRequest: one request's life (headers, response,
// Done) under a token-bucket rule and under a concurrency rule, on 100
// keys: what a slot costs beside a token (its release at Done is one more
// shared-data write).
func BenchmarkConcurrencyRequest(b *testing.B) {
	for _, bc := range []struct{ name, cfg string }{
		{"token_bucket", `{"rules": [{"name": "r", "limit_keys": ["header:t"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1e9, "burst": 1e9}}]}`},
		{"concurrency", `{"rules": [{"name": "r", "limit_keys": ["header:t"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1000}}]}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := fakehost.New()
			p := newPlugin(b, h, bc.cfg)
			streams := make([]*stream, 100)
			for i := range streams {
				streams[i] = newStream("t", "k"+strconv.Itoa(i))
				streams[i].Resp = map[string]string{":status": "200"}
			}
			rs := &reused{streams[0].Stream}
			r := p.NewRequest(rs)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				s := streams[i%len(streams)]
				rs.Stream = s.Stream
				s.Added = s.Added[:0]
				if r.OnRequestHeaders() != engine.Continue {
					b.Fatal("refused")
				}
				r.OnResponseHeaders(true)
				r.Done()
			}
		})
	}
}

// TestConcurrencyKeyFlood: a client that brings far more keys than
// max_keys, each holding a slot, is bounded by the table: entries are
// evicted (counted), a release of an evicted entry gives nothing back, and
// once the flood has ended every key has its slots, none lost, none extra.
func TestConcurrencyKeyFlood(t *testing.T) {
	w := newWorld(t, `{"max_keys": 16, "rules": [{"name": "streams", "limit_keys": ["header:t"], "algorithm": "concurrency",
  "algorithm_config": {"max_in_flight": 2}}]}`)
	var open []held
	for i := range 500 {
		open = append(open, w.openN(1, "t", "flood-"+strconv.Itoa(i))[0])
	}
	for _, h := range open {
		if !admitted(h) {
			t.Fatalf("a new key refused: %+v", h.s)
		}
	}
	if n := w.count("evictions"); n == 0 {
		t.Fatal("500 keys in flight in a table of 16: no eviction counted")
	}
	if n := w.count("rule.streams.in_flight"); n != 500 {
		t.Fatalf("in_flight %d, want 500", n)
	}
	for _, h := range open {
		w.end(h.s, h.r)
	}
	if n, lost := w.count("rule.streams.in_flight"), w.count("slots_lost"); n != 0 || lost != 0 || engine.SlotsOwed(w.p) != 0 {
		t.Fatalf("in_flight %d, slots_lost %d, owed %d; want 0", n, lost, engine.SlotsOwed(w.p))
	}
	for _, i := range []int{0, 17, 499} {
		if n := w.freeSlots("flood-" + strconv.Itoa(i)); n != 2 {
			t.Fatalf("key %d: %d free after the flood, want 2", i, n)
		}
	}
}
