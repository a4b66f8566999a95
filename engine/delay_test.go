package engine_test

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// Holding requests until their tokens are there (max_delay_ms, delay.go).

const smooth = `{"rules": [{"name": "smooth", "limit_keys": ["header:k"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000%s}}]}`

func smoothCfg(extra string) string { return sprintf(smooth, extra) }

func sprintf(f, a string) string {
	for i := 0; i+1 < len(f); i++ {
		if f[i] == '%' && f[i+1] == 's' {
			return f[:i] + a + f[i+2:]
		}
	}
	return f
}

// held is one request opened on the world and, when held, its timer.
type held struct {
	s *stream
	r *engine.Request
}

// openN opens n requests with the headers at the world's now.
func (w *world) openN(n int, headers ...string) []held {
	out := make([]held, n)
	for i := range out {
		s, r := w.open(headers...)
		out[i] = held{s, r}
	}
	return out
}

// fireAll runs the timers of hs due by the world's now.
func (w *world) fireAll(hs []held) int {
	n := 0
	for _, h := range hs {
		n += h.s.Fire(w.h.Now())
	}
	return n
}

// TestDelaySpacing: at 10 a second, burst 1, max_delay_ms 1000, 30
// requests at once on one key: one goes at once, ten are held and go 100 ms
// apart, in the order they came, never sooner; the rest are refused at once
// with the Retry-After they would get without holding.
func TestDelaySpacing(t *testing.T) {
	w := newWorld(t, smoothCfg(""))
	t0 := w.h.Now()
	hs := w.openN(30, "k", "a")
	if hs[0].s.action != engine.Continue {
		t.Fatalf("first request: %v, want it to go at once", hs[0].s.action)
	}
	for i := 1; i <= 10; i++ {
		if s := hs[i].s; s.action != engine.Pause || s.Replied != 0 || len(s.Timers) != 1 {
			t.Fatalf("request %d: action %v, replied %d, timers %d; want held", i, s.action, s.Replied, len(s.Timers))
		}
		if due := hs[i].s.Timers[0].Due; due != t0+int64(i)*sec/10 {
			t.Fatalf("request %d held until t0+%v, want t0+%v", i, due-t0, int64(i)*sec/10)
		}
	}
	for i := 11; i < 30; i++ {
		s := hs[i].s
		if s.Replied != 429 || len(s.Timers) != 0 {
			t.Fatalf("request %d: replied %d, timers %d; want refused at once", i, s.Replied, len(s.Timers))
		}
		// Ten tokens owed, one more wanted: 1.1 s, two whole seconds.
		if ra, _ := strconv.Atoi(headerOf(s.ReplyHeaders, "retry-after")); ra < 2 || ra > 3 {
			t.Fatalf("request %d: Retry-After %d, want 2 (jittered up to 3)", i, ra)
		}
	}
	if w.count("rule.smooth.delay_refused") != 19 || w.count("rule.smooth.waiting") != 10 {
		t.Fatalf("delay_refused %d, waiting %d; want 19, 10", w.count("rule.smooth.delay_refused"), w.count("rule.smooth.waiting"))
	}
	// Time passes in steps of 50 ms: each step releases what is due, in
	// order, never sooner.
	gone := 0
	for step := 1; step <= 22; step++ {
		w.h.Clock.Set(t0 + int64(step)*sec/20)
		for i := 1; i <= 10; i++ {
			n := hs[i].s.Fire(w.h.Now())
			if n == 1 {
				gone++
				if gone != i {
					t.Fatalf("request %d went on as number %d: out of order", i, gone)
				}
				if hs[i].s.Resumed != 1 {
					t.Fatalf("request %d fired but not resumed", i)
				}
			}
		}
		if want := min(step/2, 10); gone != want {
			t.Fatalf("at t0+%dms: %d gone on, want %d", step*50, gone, want)
		}
	}
	// The response of a held request says how long it was held, and its
	// RateLimit headers stand as they are when it goes on.
	s, r := hs[3].s, hs[3].r
	s.Resp = map[string]string{":status": "200"}
	r.OnResponseHeaders(true)
	if got := addedOf(s, engine.DelayHeader); got != "300" {
		t.Fatalf("%s = %q, want 300 (held 300 ms)", engine.DelayHeader, got)
	}
	if got := addedOf(s, "ratelimit-remaining"); got != "0" {
		t.Fatalf("ratelimit-remaining = %q, want 0", got)
	}
	if w.count("rule.smooth.delayed") != 10 || w.count("rule.smooth.delay_ms") != 5500 || w.count("rule.smooth.waiting") != 0 {
		t.Fatalf("delayed %d, delay_ms %d, waiting %d; want 10, 5500, 0", w.count("rule.smooth.delayed"), w.count("rule.smooth.delay_ms"), w.count("rule.smooth.waiting"))
	}
}

func headerOf(hs [][2]string, name string) string {
	for _, h := range hs {
		if h[0] == name {
			return h[1]
		}
	}
	return ""
}

func addedOf(s *stream, name string) string { return headerOf(s.Added, name) }

// TestDelayAbandoned: a held request whose client goes away (Done) or that
// Envoy answers itself (a timeout: OnResponseHeaders) gives its tokens
// back, once; a later request then waits less. Its timer never runs.
func TestDelayAbandoned(t *testing.T) {
	for _, how := range []string{"client gone", "envoy timeout"} {
		t.Run(how, func(t *testing.T) {
			w := newWorld(t, smoothCfg(""))
			t0 := w.h.Now()
			hs := w.openN(3, "k", "a") // at once, +100ms, +200ms
			last := hs[2]
			switch how {
			case "client gone":
				last.s.Done = true
				last.r.Done()
				last.r.Done()
			default:
				last.s.Resp = map[string]string{":status": "504"}
				last.r.OnResponseHeaders(true)
				last.s.Done = true
				last.r.Done()
			}
			if w.count("refunds") != 1 || w.count("rule.smooth.delay_abandoned") != 1 || w.count("rule.smooth.waiting") != 1 {
				t.Fatalf("refunds %d, abandoned %d, waiting %d; want 1, 1, 1", w.count("refunds"), w.count("rule.smooth.delay_abandoned"), w.count("rule.smooth.waiting"))
			}
			if last.s.Fire(t0+sec) != 0 || last.s.Resumed != 0 {
				t.Fatal("an abandoned request's timer ran")
			}
			// Its place is free: the next request waits 200 ms, not 300.
			next := w.openN(1, "k", "a")[0]
			if len(next.s.Timers) != 1 || next.s.Timers[0].Due != t0+2*sec/10 {
				t.Fatalf("next request: timers %v, want one due at t0+200ms", next.s.Timers)
			}
		})
	}
}

// TestDelayAbandonedMidQueue: a held request with later holders behind it
// gives back nothing when it goes (they keep their moments, bucket.Cancel),
// and no one goes sooner than the rate allows.
func TestDelayAbandonedMidQueue(t *testing.T) {
	w := newWorld(t, smoothCfg(""))
	t0 := w.h.Now()
	hs := w.openN(3, "k", "a")
	hs[1].s.Done = true
	hs[1].r.Done()
	next := w.openN(1, "k", "a")[0]
	if len(next.s.Timers) != 1 || next.s.Timers[0].Due != t0+3*sec/10 {
		t.Fatalf("next request: timers %v, want one due at t0+300ms", next.s.Timers)
	}
}

// TestDelayStacked: two rules that hold: the request waits for the longer
// wait; a rule that refuses refuses the whole request, and nothing stays
// taken.
func TestDelayStacked(t *testing.T) {
	cfg := `{"rules": [
  {"name": "fast", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}},
  {"name": "slow", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 2, "burst": 1, "max_delay_ms": 1000}}]}`
	w := newWorld(t, cfg)
	t0 := w.h.Now()
	hs := w.openN(4, "k", "a")
	if hs[0].s.action != engine.Continue {
		t.Fatal("first request held")
	}
	for i, want := range []int64{500, 1000} {
		s := hs[i+1].s
		if len(s.Timers) != 1 || s.Timers[0].Due != t0+want*1e6 {
			t.Fatalf("request %d: timers %v, want one due at t0+%dms (the slower rule's wait)", i+1, s.Timers, want)
		}
	}
	if hs[3].s.Replied != 429 || w.count("rule.slow.delay_refused") != 1 {
		t.Fatalf("fourth request: replied %d, slow.delay_refused %d; want 429, 1", hs[3].s.Replied, w.count("rule.slow.delay_refused"))
	}
	// The refusal took nothing: every bucket is decided before any is
	// written, so the fast rule's bucket still allows a wait of 300 ms.
	if w.count("refunds") != 0 {
		t.Fatalf("refunds %d, want 0", w.count("refunds"))
	}
	if again := w.openN(1)[0]; again.s.Replied != 429 || w.count("rule.slow.delay_refused") != 2 {
		t.Fatalf("fifth request: replied %d, want refused by the slow rule again", again.s.Replied)
	}
}

// TestDelayShadow: a shadow rule that would hold counts it and holds
// nothing.
func TestDelayShadow(t *testing.T) {
	cfg := `{"rules": [{"name": "s", "mode": "shadow", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}}]}`
	w := newWorld(t, cfg)
	for i := range 5 {
		if got := w.do(); got.status != 200 || len(got.stream.Timers) != 0 {
			t.Fatalf("request %d: status %d, timers %d; want it to go at once", i, got.status, len(got.stream.Timers))
		}
	}
	if w.count("rule.s.shadow_delayed") != 4 {
		t.Fatalf("shadow_delayed %d, want 4", w.count("rule.s.shadow_delayed"))
	}
}

// TestDelayMaxWaiting: past max_waiting held requests, one that would wait
// is refused at once and counted; once one goes on, its place is free.
func TestDelayMaxWaiting(t *testing.T) {
	w := newWorld(t, smoothCfg(`, "max_waiting": 2`))
	t0 := w.h.Now()
	hs := w.openN(4, "k", "a")
	if len(hs[1].s.Timers) != 1 || len(hs[2].s.Timers) != 1 {
		t.Fatal("the first two short requests were not held")
	}
	if hs[3].s.Replied != 429 || w.count("rule.smooth.waiting_full") != 1 || w.count("rule.smooth.delay_refused") != 0 {
		t.Fatalf("third short request: replied %d, waiting_full %d, delay_refused %d; want 429, 1, 0",
			hs[3].s.Replied, w.count("rule.smooth.waiting_full"), w.count("rule.smooth.delay_refused"))
	}
	w.h.Clock.Set(t0 + sec/10)
	w.fireAll(hs)
	if more := w.openN(1, "k", "a")[0]; len(more.s.Timers) != 1 {
		t.Fatalf("after one went on: replied %d, want held", more.s.Replied)
	}
}

// TestDelayNoTimer: a host that cannot hold the request lets it go at
// once, logged.
func TestDelayNoTimer(t *testing.T) {
	w := newWorld(t, smoothCfg(""))
	w.do("k", "a")
	s := newStream("k", "a")
	s.NoTimer = true
	if a := w.p.NewRequest(s).OnRequestHeaders(); a != engine.Continue || s.Replied != 0 {
		t.Fatalf("action %v, replied %d; want it to go on", a, s.Replied)
	}
	if w.h.Warns != 1 || w.count("rule.smooth.failed_open") != 1 {
		t.Fatalf("warnings %d, failed_open %d; want 1, 1", w.h.Warns, w.count("rule.smooth.failed_open"))
	}
}

// TestDelayCluster: a cluster rule that holds sends max_delay_ms and holds
// the request for the answer's wait_ms.
func TestDelayCluster(t *testing.T) {
	cfg := `{"service": {"cluster": "limitd"}, "rules": [{"name": "fleet", "scope": "cluster", "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}}]}`
	w := newWorld(t, cfg)
	s, r := w.open()
	if len(s.Calls) != 1 {
		t.Fatalf("calls %d, want 1", len(s.Calls))
	}
	if body := string(s.Calls[0].Call.Body); !containsStr(body, `"max_delay_ms":1000`) {
		t.Fatalf("decide call %s, want max_delay_ms 1000", body)
	}
	t1 := w.h.Now() + 5e6
	w.h.Clock.Set(t1)
	s.Calls[0].Answer(&engine.Answer{Status: "200", Body: []byte(`{"allowed":true,"retry_after_ms":0,"wait_ms":300,"buckets":[{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":400,"wait_ms":300}]}`)})
	if s.Resumed != 0 || len(s.Timers) != 1 || s.Timers[0].Due != t1+300e6 {
		t.Fatalf("resumed %d, timers %v; want held until the answer's wait", s.Resumed, s.Timers)
	}
	w.h.Clock.Set(t1 + 300e6)
	s.Fire(w.h.Now())
	if s.Resumed != 1 {
		t.Fatal("not resumed after the wait")
	}
	s.Resp = map[string]string{":status": "200"}
	r.OnResponseHeaders(true)
	if got := addedOf(s, engine.DelayHeader); got != "305" {
		t.Fatalf("%s = %q, want 305", engine.DelayHeader, got)
	}
}

func containsStr(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestPropertyDelay: random arrivals, costs and give-ups on one key, on the
// fake host with its timers: counting each request at the moment it goes
// on (at once, or when its timer runs), the cost going on over any interval
// [a, b] never exceeds burst + rate × (b − a); no request is held past
// max_delay_ms; a give-up refunds at most once and its timer never runs.
func TestPropertyDelay(t *testing.T) { propertyDelay(t, false) }

// TestPropertyDelayCluster is TestPropertyDelay on a cluster rule answered
// by limitd (its memory store on the fake clock): a held request that gives
// up leaves its tokens spent, so the bound holds over every interval (a
// refund let a later request go on beside the holders behind it: twice the
// rate while they went on).
func TestPropertyDelayCluster(t *testing.T) { propertyDelay(t, true) }

func propertyDelay(t *testing.T, cluster bool) {
	for seed := range uint64(30) {
		r := rand.New(rand.NewPCG(seed, 34))
		rate := float64(1 + r.IntN(20))
		burst := float64(1 + r.IntN(5))
		maxDelay := int64(100 + r.IntN(2000))
		top, scope := "", ""
		if cluster {
			top, scope = `"service": {"cluster": "limitd"}, `, `"scope": "cluster", `
		}
		cfg := `{` + top + `"rules": [{"name": "p", ` + scope + `"algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": ` +
			strconv.FormatFloat(rate, 'g', -1, 64) + `, "burst": ` + strconv.FormatFloat(burst, 'g', -1, 64) +
			`, "max_delay_ms": ` + strconv.FormatInt(maxDelay, 10) + `, "cost_source": "header:c"}}]}`
		w := newWorld(t, cfg)
		if cluster {
			w.withLimitd()
		}
		type goes struct {
			at   int64
			cost float64
		}
		var out []goes
		type open struct {
			h      held
			cost   float64
			at     int64
			giveUp int64 // when it gives up while held (0: never)
		}
		var live []*open
		now := w.h.Now()
		refundsBefore := int64(0)
		for range 300 {
			now += r.Int64N(sec / 5)
			w.h.Clock.Set(now)
			// What is due by now: give-ups and timers, in time order.
			for {
				var first *open
				firstAt := now + 1
				for _, o := range live {
					if o.h.s.Done || o.h.s.Resumed > 0 {
						continue
					}
					if o.giveUp > 0 && o.giveUp < firstAt && o.giveUp < o.h.s.Timers[0].Due {
						first, firstAt = o, o.giveUp
					}
					if d := o.h.s.Timers[0].Due; d < firstAt && (o.giveUp == 0 || d <= o.giveUp) {
						first, firstAt = o, d
					}
				}
				if first == nil {
					break
				}
				w.h.Clock.Set(firstAt)
				if first.giveUp == firstAt {
					refundsBefore = w.count("refunds")
					first.h.s.Done = true
					first.h.r.Done()
					first.h.r.Done()
					if cluster {
						w.limitd.serve()
					}
					if n := w.count("refunds") - refundsBefore; n > 1 {
						t.Fatalf("seed %d: a give-up refunded %d times", seed, n)
					}
					continue
				}
				if first.h.s.Fire(firstAt) != 1 {
					t.Fatalf("seed %d: a due timer did not run", seed)
				}
				if held := firstAt - first.at; held > maxDelay*1e6 {
					t.Fatalf("seed %d: held %v ns, past max_delay_ms %d", seed, held, maxDelay)
				}
				out = append(out, goes{firstAt, first.cost})
			}
			w.h.Clock.Set(now)
			cost := float64(1 + r.IntN(int(burst)))
			s, req := w.open("c", strconv.FormatFloat(cost, 'g', -1, 64))
			if cluster {
				w.limitd.serve(s)
			}
			switch {
			case s.Replied != 0:
			case s.action == engine.Continue || s.Resumed > 0:
				out = append(out, goes{now, cost})
			default:
				o := &open{h: held{s, req}, cost: cost, at: now}
				if len(s.Timers) != 1 {
					t.Fatalf("seed %d: paused without a timer", seed)
				}
				if r.IntN(4) == 0 {
					o.giveUp = now + 1 + r.Int64N(s.Timers[0].Due-now)
				}
				live = append(live, o)
			}
		}
		for i := 1; i < len(out); i++ {
			for j := i; j > 0 && out[j].at < out[j-1].at; j-- {
				out[j], out[j-1] = out[j-1], out[j]
			}
		}
		for i := range out {
			sum := 0.0
			for j := i; j < len(out); j++ {
				sum += out[j].cost
				span := float64(out[j].at-out[i].at) / 1e9
				// The service answers waits in whole milliseconds,
				// rounded up: a moment up to 1 ms late brings the next
				// one up to 1 ms closer.
				if cluster {
					span += 1e-3
				}
				if bound := burst + rate*span + 1e-6*float64(j-i+1); sum > bound {
					t.Fatalf("seed %d: %v going on over %v s, bound %v", seed, sum, span, bound)
				}
			}
		}
	}
}

// TestDelayClusterAbandoned: a request held for a cluster rule's wait
// (limitd's memory store answering) whose client goes away gives nothing
// back (no charge call): the service cannot tell whether others reserved
// behind it, so its tokens stay spent and the next request goes on after
// its moment, never beside a holder (TestPropertyDelayCluster).
func TestDelayClusterAbandoned(t *testing.T) {
	cfg := `{"service": {"cluster": "limitd"}, "rules": [{"name": "fleet", "scope": "cluster", "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}}]}`
	w := newWorld(t, cfg).withLimitd()
	t0 := w.h.Now()
	if got := w.do(); got.status != 200 {
		t.Fatalf("first request: %d", got.status)
	}
	s, r := w.open()
	w.limitd.serve(s)
	if len(s.Timers) != 1 || s.Timers[0].Due != t0+sec/10 {
		t.Fatalf("second request: timers %v, want held until t0+100ms", s.Timers)
	}
	s.Done = true
	r.Done()
	r.Done()
	w.limitd.serve()
	if w.count("charge_calls") != 0 || w.count("refunds") != 0 || w.count("rule.fleet.delay_abandoned") != 1 {
		t.Fatalf("charge_calls %d, refunds %d, abandoned %d; want 0, 0, 1",
			w.count("charge_calls"), w.count("refunds"), w.count("rule.fleet.delay_abandoned"))
	}
	next, _ := w.open()
	w.limitd.serve(next)
	if len(next.Timers) != 1 || next.Timers[0].Due != t0+2*sec/10 {
		t.Fatalf("next request: timers %v, want held until t0+200ms (the abandoned tokens spent)", next.Timers)
	}
}

// TestDelayClusterTimeline: a cluster rule answered by limitd (its memory
// store on the fake clock): twelve requests at one moment, one goes at
// once, ten are held 100 ms apart, the twelfth is refused at once. A local
// rule stacked on it holds for the longer of the two waits.
func TestDelayClusterTimeline(t *testing.T) {
	cfg := `{"service": {"cluster": "limitd"}, "rules": [
  {"name": "fleet", "scope": "cluster", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}},
  {"name": "here", "match": {"header:x-stack": {"present": true}}, "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 2, "burst": 1, "max_delay_ms": 1000}}]}`
	w := newWorld(t, cfg).withLimitd()
	t0 := w.h.Now()
	for i := range 12 {
		s, _ := w.open()
		w.limitd.serve(s)
		switch {
		case i == 0:
			if s.Resumed != 1 || len(s.Timers) != 0 {
				t.Fatalf("request 0: resumed %d, timers %d; want it to go on with the answer", s.Resumed, len(s.Timers))
			}
		case i <= 10:
			if len(s.Timers) != 1 || s.Timers[0].Due != t0+int64(i)*sec/10 {
				t.Fatalf("request %d: timers %v, want held until t0+%dms", i, s.Timers, 100*i)
			}
		default:
			if s.Replied != 429 || len(s.Timers) != 0 {
				t.Fatalf("request %d: replied %d, timers %d; want refused at once", i, s.Replied, len(s.Timers))
			}
		}
	}
	// Stacked: the fleet's next wait is 1.1 s, past its bound; a second
	// later (fleet: 100 ms), the local rule's wait (500 ms) is the longer.
	w.h.Clock.Set(t0 + 2*sec)
	first, _ := w.open("x-stack", "1")
	w.limitd.serve(first)
	if first.Resumed != 1 || len(first.Timers) != 0 {
		t.Fatalf("stacked, first: resumed %d, timers %d; want it to go on with the answer", first.Resumed, len(first.Timers))
	}
	s, _ := w.open("x-stack", "1")
	w.limitd.serve(s)
	if len(s.Timers) != 1 || s.Timers[0].Due != w.h.Now()+sec/2 {
		t.Fatalf("stacked: timers %v, want held until now+500ms (the local rule's wait, longer than the fleet's 100 ms)", s.Timers)
	}
}
