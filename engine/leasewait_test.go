package engine_test

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// leaseSmooth is a leased cluster rule at 10 a second, burst 1, holding a
// request up to a second.
const leaseSmooth = `{"service": {"cluster": "limitd"}, "rules": [
  {"name": "fleet", "scope": "cluster", "sync": "lease", "algorithm": "token_bucket",
   "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}}]}`

// TestDelayLeaseTimeline: a leased rule (limitd's memory store on the fake
// clock) at 10 a second, burst 1, max_delay_ms 1000, thirty requests at one
// moment: one goes at once, ten are held on the lease and go on one by one
// as the lease's refills grant their tokens, 100 ms apart and in the order
// they came, never sooner; the rest are refused at once with the
// Retry-After they get without holding. The last one in line hangs up
// while held: a newcomer takes its place.
func TestDelayLeaseTimeline(t *testing.T) {
	w := newWorld(t, leaseSmooth).withLimitd()
	t0 := w.h.Now()
	hs := make([]held, 30)
	for i := range hs {
		s, r := w.open()
		w.limitd.serve(s)
		hs[i] = held{s, r}
		switch {
		case i == 0:
			if s.Resumed != 1 || len(s.Timers) != 0 {
				t.Fatalf("request 0: resumed %d, timers %d; want it to go on with the lease's grant", s.Resumed, len(s.Timers))
			}
		case i <= 10:
			if !s.paused() || len(s.Timers) != 1 || s.Timers[0].Due != t0+int64(i)*sec/10 {
				t.Fatalf("request %d: replied %d, resumed %d, timers %v; want held until t0+%dms", i, s.Replied, s.Resumed, s.Timers, 100*i)
			}
		default:
			if s.Replied != 429 || len(s.Timers) != 0 {
				t.Fatalf("request %d: replied %d, timers %d; want refused at once", i, s.Replied, len(s.Timers))
			}
			// The wait until its turn behind the ten held: 1.1 s, two
			// whole seconds (as a local rule's refusal past its bound).
			if ra := headerOf(s.ReplyHeaders, "retry-after"); ra != "2" && ra != "3" {
				t.Fatalf("request %d: Retry-After %q, want 2 (jittered up to 3)", i, ra)
			}
		}
	}
	if got := w.count("rule.fleet.waiting"); got != 10 {
		t.Fatalf("waiting %d, want 10", got)
	}
	if got := w.count("rule.fleet.delay_refused"); got != 19 {
		t.Fatalf("delay_refused %d, want 19", got)
	}
	// The last in line hangs up: it took nothing, and its place is free.
	w.h.Clock.Set(t0 + sec/4)
	w.end(hs[10].s, hs[10].r)
	if got := w.count("rule.fleet.delay_abandoned"); got != 1 || w.count("rule.fleet.waiting") != 9 {
		t.Fatalf("after the hang-up: delay_abandoned %d, waiting %d; want 1, 9", got, w.count("rule.fleet.waiting"))
	}
	late, lateR := w.open()
	w.limitd.serve(late)
	if len(late.Timers) != 1 || late.Timers[0].Due != t0+sec {
		t.Fatalf("newcomer at t0+250ms: timers %v, want held until t0+1s (the place the hang-up freed)", late.Timers)
	}
	hs[10] = held{late, lateR}
	// Each held request goes on at its turn, spending the grant of the
	// refill it asks for, never before.
	for step := int64(1); step <= 10; step++ {
		w.h.Clock.Set(t0 + step*sec/10)
		for i := 1; i <= 10; i++ {
			s := hs[i].s
			s.Fire(w.h.Now())
			w.limitd.serve(s)
			switch wentOn := s.Resumed == 1; {
			case int64(i) <= step && !wentOn:
				t.Fatalf("at t0+%dms request %d has not gone on (replied %d, timers %v)", 100*step, i, s.Replied, s.Timers)
			case int64(i) > step && (wentOn || s.Replied != 0):
				t.Fatalf("at t0+%dms request %d went on or was refused (replied %d) before its turn", 100*step, i, s.Replied)
			}
		}
	}
	for i := 1; i <= 10; i++ {
		w.respond(hs[i].s, hs[i].r, upstream{})
		held, _ := strconv.Atoi(addedOf(hs[i].s, engine.DelayHeader))
		if want := 100 * i; i != 10 && held != want {
			t.Fatalf("request %d: %s %d, want %d", i, engine.DelayHeader, held, want)
		}
		w.end(hs[i].s, hs[i].r)
	}
	if got := addedOf(late, engine.DelayHeader); got != "750" {
		t.Fatalf("newcomer: %s %q, want 750", engine.DelayHeader, got)
	}
	if w.count("rule.fleet.delayed") != 10 || w.count("rule.fleet.waiting") != 0 || w.count("rule.fleet.allowed") != 11 {
		t.Fatalf("delayed %d, waiting %d, allowed %d; want 10, 0, 11", w.count("rule.fleet.delayed"), w.count("rule.fleet.waiting"), w.count("rule.fleet.allowed"))
	}
	// One lease call for each grant (eleven), and the one refusal the
	// held requests waited on.
	if got := w.count("lease_calls"); got != 12 {
		t.Fatalf("lease calls %d, want 12", got)
	}
	w.h.Clock.Set(t0 + 11*sec/10)
	w.tick()
	if engine.LeaseLines(w.p) != 0 {
		t.Fatalf("after the last turn the tick keeps %d lines", engine.LeaseLines(w.p))
	}
}

// TestDelayLeaseStacked: a request with a leased rule and a local rule that
// both hold waits for the longer of the two waits; one that hangs up while
// held on its lease gives its local reservation back and frees its place
// in both lines.
func TestDelayLeaseStacked(t *testing.T) {
	cfg := `{"service": {"cluster": "limitd"}, "rules": [
  {"name": "fleet", "scope": "cluster", "sync": "lease", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}},
  {"name": "here", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 2, "burst": 1, "max_delay_ms": 1000}}]}`
	w := newWorld(t, cfg).withLimitd()
	t0 := w.h.Now()
	a, _ := w.open()
	w.limitd.serve(a)
	if a.Resumed != 1 {
		t.Fatalf("first: resumed %d, replied %d; want it to go on", a.Resumed, a.Replied)
	}
	// B: the local rule's wait (500 ms) is longer than the lease's (100 ms).
	b, br := w.open()
	w.limitd.serve(b)
	if len(b.Timers) != 1 || b.Timers[0].Due != t0+sec/10 {
		t.Fatalf("B: timers %v, want held on the lease until t0+100ms", b.Timers)
	}
	// C: the local rule's wait is 1 s; the lease's turn is at 200 ms.
	c, cr := w.open()
	w.limitd.serve(c)
	if len(c.Timers) != 1 || c.Timers[0].Due != t0+2*sec/10 {
		t.Fatalf("C: timers %v, want held on the lease until t0+200ms", c.Timers)
	}
	w.h.Clock.Set(t0 + sec/10)
	b.Fire(w.h.Now())
	w.limitd.serve(b)
	if b.Resumed != 0 || len(b.Timers) != 2 || b.Timers[1].Due != t0+sec/2 {
		t.Fatalf("B after its lease turn: resumed %d, timers %v; want held on until t0+500ms (the local wait)", b.Resumed, b.Timers)
	}
	// C hangs up while held on its lease: its local reservation (the last
	// in the local line) comes back whole, and nothing left its lease.
	w.h.Clock.Set(t0 + 15*sec/100)
	w.end(c, cr)
	if w.count("rule.fleet.delay_abandoned") != 1 || w.count("refunds") != 1 {
		t.Fatalf("after C hung up: fleet delay_abandoned %d, refunds %d; want 1, 1", w.count("rule.fleet.delay_abandoned"), w.count("refunds"))
	}
	// D takes C's places: the lease's turn at 200 ms, the local one at 1 s.
	d, dr := w.open()
	w.limitd.serve(d)
	if len(d.Timers) != 1 || d.Timers[0].Due != t0+2*sec/10 {
		t.Fatalf("D: timers %v, want held on the lease until t0+200ms", d.Timers)
	}
	w.h.Clock.Set(t0 + 2*sec/10)
	d.Fire(w.h.Now())
	w.limitd.serve(d)
	if len(d.Timers) != 2 || d.Timers[1].Due != t0+sec {
		t.Fatalf("D after its lease turn: timers %v; want held on until t0+1s (the local wait)", d.Timers)
	}
	w.h.Clock.Set(t0 + sec/2)
	b.Fire(w.h.Now())
	w.h.Clock.Set(t0 + sec)
	d.Fire(w.h.Now())
	for _, x := range []struct {
		name string
		s    *stream
		r    *engine.Request
		want string
	}{{"B", b, br, "500"}, {"D", d, dr, "850"}} {
		if x.s.Resumed != 1 {
			t.Fatalf("%s: resumed %d, replied %d; want it gone on", x.name, x.s.Resumed, x.s.Replied)
		}
		w.respond(x.s, x.r, upstream{})
		if got := addedOf(x.s, engine.DelayHeader); got != x.want {
			t.Fatalf("%s: %s %q, want %s", x.name, engine.DelayHeader, got, x.want)
		}
	}
	if w.count("rule.fleet.delayed") != 2 || w.count("rule.here.delayed") != 2 || w.count("rule.fleet.waiting") != 0 || w.count("rule.here.waiting") != 0 {
		t.Fatalf("delayed fleet %d here %d, waiting fleet %d here %d; want 2, 2, 0, 0", w.count("rule.fleet.delayed"),
			w.count("rule.here.delayed"), w.count("rule.fleet.waiting"), w.count("rule.here.waiting"))
	}
}

// TestDelayLeaseBound: for random arrivals, costs and hang-ups on a leased
// rule that holds (limitd's memory store on the fake clock), the costs
// admitted from the start never pass burst + rate × t (nor, over any
// interval, that plus the most a lease holds: max_share × burst), no
// request is held past max_delay_ms, and every held request ends: gone
// on, refused or hung up, none still waiting.
func TestDelayLeaseBound(t *testing.T) {
	const (
		rate, burst, share = 10.0, 4.0, 0.5
		bound              = sec
		step               = sec / 100
	)
	cfg := `{"service": {"cluster": "limitd"}, "rules": [
  {"name": "fleet", "scope": "cluster", "sync": "lease", "lease": {"max_share": 0.5}, "algorithm": "token_bucket",
   "algorithm_config": {"tokens_per_second": 10, "burst": 4, "cost_source": "header:x-cost", "max_delay_ms": 1000, "max_waiting": 8}}]}`
	for seed := range 20 {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		w := newWorld(t, cfg).withLimitd()
		t0 := w.h.Now()
		type req struct {
			s      *stream
			r      *engine.Request
			cost   float64
			at     int64
			closed bool
		}
		var open []*req
		type admission struct {
			at   int64
			cost float64
		}
		var admitted []admission
		settle := func(q *req) {
			switch {
			case q.closed:
			case q.s.action == engine.Continue || q.s.Resumed >= 1:
				if q.s.Resumed > 1 || q.s.Replied != 0 {
					t.Fatalf("seed %d: resumed %d, replied %d", seed, q.s.Resumed, q.s.Replied)
				}
				if held := w.h.Now() - q.at; held > bound {
					t.Fatalf("seed %d: a request held %v, past max_delay_ms", seed, held)
				}
				admitted = append(admitted, admission{w.h.Now(), q.cost})
				w.respond(q.s, q.r, upstream{})
				w.end(q.s, q.r)
				q.closed = true
			case q.s.Replied != 0:
				w.end(q.s, q.r)
				q.closed = true
			}
		}
		for now := t0; now < t0+4*sec+2*bound; now += step { // arrivals for 4 s, then none
			w.h.Clock.Set(now)
			for _, q := range open {
				if !q.closed {
					q.s.Fire(now)
					w.limitd.serve(q.s)
					settle(q)
				}
			}
			for range rng.IntN(3) * int(min(max(t0+4*sec-now, 0), 1)) {
				cost := float64(1 + rng.IntN(2))
				s, r := w.open("x-cost", strconv.Itoa(int(cost)))
				w.limitd.serve(s)
				q := &req{s: s, r: r, cost: cost, at: now}
				open = append(open, q)
				settle(q)
			}
			for _, q := range open { // a held request hangs up now and then
				if !q.closed && rng.IntN(300) == 0 {
					w.end(q.s, q.r)
					q.closed = true
				}
			}
			if (now-t0)%sec == 0 {
				w.tick()
			}
		}
		// Past every bound: nothing is still held.
		for _, q := range open {
			if !q.closed && q.s.paused() {
				t.Fatalf("seed %d: a request from t0+%v still waits at t0+%v", seed, q.at-t0, w.h.Now()-t0)
			}
		}
		for i, a := range admitted {
			sum := 0.0
			for _, b := range admitted[i:] {
				sum += b.cost
				el := float64(b.at-a.at) / 1e9
				if most := burst + share*burst + rate*el; sum > most+1e-9 {
					t.Fatalf("seed %d: %v tokens admitted over %vs from t0+%v, more than %v", seed, sum, el, a.at-t0, most)
				}
			}
		}
		total := 0.0
		for _, a := range admitted {
			total += a.cost
		}
		if last := w.h.Now() - t0; total > burst+rate*float64(last)/1e9 {
			t.Fatalf("seed %d: %v tokens admitted in %v", seed, total, last)
		}
		t.Logf("seed %d: admitted %v tokens (%d requests), delayed %d, delay_refused %d, waiting_full %d, abandoned %d", seed, total, len(admitted),
			w.count("rule.fleet.delayed"), w.count("rule.fleet.delay_refused"), w.count("rule.fleet.waiting_full"), w.count("rule.fleet.delay_abandoned"))
		if w.count("rule.fleet.delayed") == 0 || w.count("rule.fleet.waiting") != 0 {
			t.Fatalf("seed %d: delayed %d, waiting %d; want some held, none left", seed, w.count("rule.fleet.delayed"), w.count("rule.fleet.waiting"))
		}
	}
}

// TestDelayLeaseFullAndNoTimer: a leased rule holding max_waiting requests
// refuses the next one at once (waiting_full), and a host without a timer
// refuses a request as it would without holding.
func TestDelayLeaseFullAndNoTimer(t *testing.T) {
	cfg := strings.Replace(leaseSmooth, `"max_delay_ms": 1000`, `"max_delay_ms": 1000, "max_waiting": 2`, 1)
	w := newWorld(t, cfg).withLimitd()
	for i := range 4 {
		s, _ := w.open()
		w.limitd.serve(s)
		switch {
		case i == 0 && s.Resumed != 1, i > 0 && i < 3 && !s.paused(), i == 3 && s.Replied != 429:
			t.Fatalf("request %d: resumed %d, replied %d, timers %d", i, s.Resumed, s.Replied, len(s.Timers))
		}
	}
	if w.count("rule.fleet.waiting_full") != 1 || w.count("rule.fleet.waiting") != 2 {
		t.Fatalf("waiting_full %d, waiting %d; want 1, 2", w.count("rule.fleet.waiting_full"), w.count("rule.fleet.waiting"))
	}
	w2 := newWorld(t, leaseSmooth).withLimitd()
	w2.do() // takes the one token
	s := newStream()
	s.Clock, s.NoTimer = w2.h.Clock, true
	r := w2.p.NewRequest(s)
	s.action = r.OnRequestHeaders()
	w2.limitd.serve(s)
	if s.Replied != 429 || w2.count("rule.fleet.waiting") != 0 || w2.count("rule.fleet.delay_refused") != 1 {
		t.Fatalf("no timer: replied %d, waiting %d, delay_refused %d; want 429, 0, 1", s.Replied, w2.count("rule.fleet.waiting"), w2.count("rule.fleet.delay_refused"))
	}
}
