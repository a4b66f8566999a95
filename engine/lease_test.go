package engine

import (
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// leasedFleet is one leased cluster rule: burst 40 (a first lease asks for
// max_share × burst / 4 = 2.5 tokens), 1 token/s.
const leasedFleet = `{"service": {"cluster": "limitd", "failure_mode": "deny"}, "rules": [
  {"name": "fleet", "scope": "cluster", "sync": "lease", "limit_keys": ["header:k"], "algorithm": "token_bucket",
   "algorithm_config": {"tokens_per_second": 1, "burst": 40}}]}`

// liveCall is a call in flight and who owns it: the plugin (s nil) or a
// request, whose calls' answers the host drops once it is gone.
type liveCall struct {
	*fakeCall
	s *fakeStream
}

// deliver answers the call as the host would: not at all when the request
// that owns it is gone.
func (c liveCall) deliver(a *Answer) {
	if c.s != nil && c.s.done {
		return
	}
	c.answer(a)
}

// newCalls returns the calls sent since the host held from of its own and
// the streams held theirs (from: len of each, in order).
func newCalls(h *fakeHost, from int, streams ...*fakeStream) []liveCall {
	var out []liveCall
	for _, c := range h.calls[from:] {
		out = append(out, liveCall{c, nil})
	}
	for _, s := range streams {
		for _, c := range s.calls {
			out = append(out, liveCall{c, s})
		}
	}
	return out
}

// grant is a lease answer granting tokens to each bucket of a call.
func grant(tokens ...float64) *Answer {
	a := &wire.LeaseAnswer{Granted: true}
	for _, n := range tokens {
		a.Buckets = append(a.Buckets, wire.Grant{Tokens: n, Remaining: 30, ResetMs: 10000})
	}
	return &Answer{Status: "200", Body: wire.AppendLeaseAnswer(nil, a)}
}

// TestLeaseGrantOutlivesItsRequest: a request waits for its lease call and
// is reset before the answer: the grant goes into the lease all the same,
// so the next request spends from it without a call.
func TestLeaseGrantOutlivesItsRequest(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, leasedFleet)
	s := newFakeStream("k", "a")
	r := p.NewRequest(s)
	if a := r.OnRequestHeaders(); a != Pause {
		t.Fatalf("first request: %v, want a pause on its lease call", a)
	}
	calls := newCalls(h, 0, s)
	if len(calls) != 1 {
		t.Fatalf("%d calls, want the lease call", len(calls))
	}
	s.done = true // reset: the host ends the request
	r.Done()
	calls[0].deliver(grant(2.5))
	if s.resumed != 0 || s.replied != 0 {
		t.Fatalf("the reset request was resumed %d times, replied %d", s.resumed, s.replied)
	}
	from := len(h.calls)
	s2 := newFakeStream("k", "a")
	if a := p.NewRequest(s2).OnRequestHeaders(); a != Continue {
		t.Fatalf("next request: %v; want it admitted from the grant the reset request's call brought", a)
	}
	if n := len(newCalls(h, from, s2)); n != 0 {
		t.Fatalf("next request sent %d calls, want none (the lease holds the grant)", n)
	}
}

// TestLeaseGrantWhileItsRequestGoesOn: the answer comes while the request
// still waits; the host runs the rest later (another thread), and the
// request is reset before that: the grant, the request's cost included,
// goes into the lease. Without the reset, the request takes its cost and
// the lease the rest.
func TestLeaseGrantWhileItsRequestGoesOn(t *testing.T) {
	for _, reset := range []bool{true, false} {
		h := newFakeHost()
		p := newPlugin(t, h, leasedFleet)
		s := newFakeStream("k", "a")
		s.deferRun = true
		r := p.NewRequest(s)
		if a := r.OnRequestHeaders(); a != Pause {
			t.Fatalf("reset %v: first request: %v, want a pause", reset, a)
		}
		calls := newCalls(h, 0, s)
		if len(calls) != 1 {
			t.Fatalf("reset %v: %d calls, want the lease call", reset, len(calls))
		}
		calls[0].deliver(grant(2.5))
		if reset {
			s.done = true
			r.Done()
		}
		s.runDeferred()
		want := 2 // whole tokens left for later requests: 2.5 − 1
		if reset {
			want = 2 // 2.5: the reset request took nothing
		} else if s.resumed != 1 {
			t.Fatalf("the waiting request was resumed %d times, want 1", s.resumed)
		}
		admitted := 0
		for range 3 {
			si := newFakeStream("k", "a")
			if p.NewRequest(si).OnRequestHeaders() == Continue {
				admitted++
			}
		}
		if reset && admitted != want || !reset && admitted != 1 {
			t.Fatalf("reset %v: %d of 3 later requests admitted from the lease, want %d", reset, admitted, map[bool]int{true: want, false: 1}[reset])
		}
	}
}

// TestReusedRequestIgnoresAnEarlierLeaseAnswer: a request is reset while it
// waits; its Request serves another request that waits for its own lease
// call; the first call's answer records its grant and does not resume the
// second request, whose own answer does.
func TestReusedRequestIgnoresAnEarlierLeaseAnswer(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, leasedFleet)
	s := newFakeStream("k", "a")
	r := p.NewRequest(s)
	r.OnRequestHeaders()
	first := newCalls(h, 0, s)
	s.done = true
	r.Done()
	s2 := newFakeStream("k", "b") // another key: its lease is empty
	r.stream = s2                 // the host reuses the Request (plugin and native adapters do)
	if a := r.OnRequestHeaders(); a != Pause {
		t.Fatalf("second request: %v, want a pause", a)
	}
	second := newCalls(h, len(first)-len(s.calls), s2)
	if len(first) != 1 || len(second) != 1 {
		t.Fatalf("calls %d and %d, want one each", len(first), len(second))
	}
	first[0].deliver(grant(2.5))
	if s2.resumed != 0 || s2.replied != 0 {
		t.Fatalf("the first request's answer resumed the second (%d) or replied (%d)", s2.resumed, s2.replied)
	}
	second[0].deliver(grant(2.5))
	if s2.resumed != 1 {
		t.Fatalf("the second request's own answer resumed it %d times, want 1", s2.resumed)
	}
}

// TestLeaseCallTimeouts: lease calls (the one a request waits for, and a
// refill) carry lease_timeout_ms, 500 ms by default; a per-request call
// keeps timeout_ms.
func TestLeaseCallTimeouts(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, leasedFleet)
	s := newFakeStream("k", "a")
	p.NewRequest(s).OnRequestHeaders()
	calls := newCalls(h, 0, s)
	if len(calls) != 1 || calls[0].call.TimeoutMS != 500 {
		t.Fatalf("lease call timeouts: %d calls, first %+v; want one of 500 ms", len(calls), calls[0].call)
	}
	calls[0].deliver(grant(2.5))
	from := len(h.calls)
	p.NewRequest(newFakeStream("k", "a")).OnRequestHeaders() // 1.5 → 0.5: claims the refill
	refill := newCalls(h, from)
	if len(refill) != 1 || refill[0].call.TimeoutMS != 500 {
		t.Fatalf("refill: %d calls; want one of 500 ms", len(refill))
	}
	h2 := newFakeHost()
	p2 := newPlugin(t, h2, fleet)
	s2 := newFakeStream()
	p2.NewRequest(s2).OnRequestHeaders()
	if c := newCalls(h2, 0, s2); len(c) != 1 || c[0].call.TimeoutMS != 25 {
		t.Fatalf("per-request call: %d calls; want one of 25 ms", len(c))
	}
}

// stackedLeases is two leased rules: "a" on every request (burst 400: a
// first lease of 25 tokens), "b" on requests with the header b; failure_mode
// allow.
const stackedLeases = `{"service": {"cluster": "limitd", "failure_mode": "allow"}, "rules": [
  {"name": "a", "scope": "cluster", "sync": "lease", "limit_keys": ["header:k"], "algorithm": "token_bucket",
   "algorithm_config": {"tokens_per_second": 1, "burst": 400}},
  {"name": "b", "scope": "cluster", "sync": "lease", "match": {"header:b": {"present": true}}, "limit_keys": ["header:k"],
   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 40}}]}`

// TestLeaseFailureSpendsWhatLeasesHold: under failure_mode allow, a request
// whose lease call fails still spends the leases that hold its cost; only
// the empty one passes unchecked (failed_open), when the call fails and for
// the second after it (time passed in), and then the lease asks again.
func TestLeaseFailureSpendsWhatLeasesHold(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, stackedLeases)
	// a's lease gets 25 tokens; the request takes 1.
	s := newFakeStream("k", "x")
	p.NewRequest(s).OnRequestHeaders()
	c := newCalls(h, 0, s)
	if len(c) != 1 {
		t.Fatalf("%d calls, want a's lease call", len(c))
	}
	c[0].deliver(grant(25))
	// b's lease is empty: the request waits for b's call, which fails.
	from := len(h.calls)
	s = newFakeStream("k", "x", "b", "1")
	if a := p.NewRequest(s).OnRequestHeaders(); a != Pause {
		t.Fatalf("a request on both rules: %v, want a pause on b's call", a)
	}
	c = newCalls(h, from, s)
	if len(c) != 1 {
		t.Fatalf("%d calls, want b's lease call", len(c))
	}
	c[0].deliver(&Answer{Failed: true})
	if s.resumed != 1 || s.replied != 0 {
		t.Fatalf("resumed %d, replied %d: want the request to go on (allow)", s.resumed, s.replied)
	}
	check := func(when string, aAllowed, aOpen, bOpen int64) {
		t.Helper()
		if got := [3]int64{h.count("rule.a.allowed"), h.count("rule.a.failed_open"), h.count("rule.b.failed_open")}; got != [3]int64{aAllowed, aOpen, bOpen} {
			t.Fatalf("%s: a allowed, a failed_open, b failed_open = %v; want %v", when, got, [3]int64{aAllowed, aOpen, bOpen})
		}
	}
	check("b's call failed", 2, 0, 1)
	// Within the second: b passes unchecked at once, with no call; a's
	// lease is spent.
	h.now += 500e6
	from = len(h.calls)
	s = newFakeStream("k", "x", "b", "1")
	if a := p.NewRequest(s).OnRequestHeaders(); a != Continue || len(newCalls(h, from, s)) != 0 {
		t.Fatalf("within the failure window: %v with %d calls; want the request admitted, no call", a, len(newCalls(h, from, s)))
	}
	check("within the window", 3, 0, 2)
	// a's lease held 25 and three requests spent from it: 22 more pass.
	admitted := 0
	for range 30 {
		if p.NewRequest(newFakeStream("k", "x")).OnRequestHeaders() == Continue {
			admitted++
		}
	}
	if admitted != 22 {
		t.Fatalf("a alone: %d admitted from what its lease holds, want 22", admitted)
	}
	// After the second, b's lease asks again.
	h.now += 600e6
	from = len(h.calls)
	s = newFakeStream("k", "x", "b", "1")
	if a := p.NewRequest(s).OnRequestHeaders(); a != Pause || len(newCalls(h, from, s)) == 0 {
		t.Fatalf("after the window: %v, want a pause on a lease call", a)
	}
}

// TestLeaseFailureAfterAGrantLanded: two requests wait for lease calls on
// one lease; the first call's grant lands, the second call fails: the
// second request spends from the lease (failure_mode deny would otherwise
// refuse it).
func TestLeaseFailureAfterAGrantLanded(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, leasedFleet)
	s1, s2 := newFakeStream("k", "a"), newFakeStream("k", "a")
	p.NewRequest(s1).OnRequestHeaders()
	c1 := newCalls(h, 0, s1)
	from := len(h.calls)
	p.NewRequest(s2).OnRequestHeaders()
	c2 := newCalls(h, from, s2)
	if len(c1) != 1 || len(c2) != 1 {
		t.Fatalf("calls %d and %d, want each request waiting for one", len(c1), len(c2))
	}
	c1[0].deliver(grant(2.5))
	if s1.resumed != 1 {
		t.Fatalf("first request resumed %d times", s1.resumed)
	}
	c2[0].deliver(&Answer{Failed: true})
	if s2.resumed != 1 || s2.replied != 0 {
		t.Fatalf("second request: resumed %d, replied %d; want it admitted from the lease its call found refilled", s2.resumed, s2.replied)
	}
	if h.count("rule.fleet.allowed") != 2 {
		t.Fatalf("allowed %d, want 2", h.count("rule.fleet.allowed"))
	}
}

// TestLeaseAnsweredWithinTheCall: a host answers the plugin's lease call
// before handing it off returns; the request never pauses, and is decided
// from the answer as recorded: a grant admits it, a failure applies
// failure_mode, with no second call.
func TestLeaseAnsweredWithinTheCall(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer *Answer
		want   Action
		status int
	}{
		{"granted", grant(2.5), Continue, 0},
		{"failed: deny", &Answer{Failed: true}, Pause, 429},
	} {
		h := newFakeHost()
		p := newPlugin(t, h, leasedFleet)
		h.atOnce = c.answer
		s := newFakeStream("k", "a")
		if a := p.NewRequest(s).OnRequestHeaders(); a != c.want || s.replied != c.status || s.resumed != 0 {
			t.Fatalf("%s: action %v, replied %d, resumed %d; want %v and %d", c.name, a, s.replied, s.resumed, c.want, c.status)
		}
		if n := h.count("lease_calls"); n != 1 {
			t.Fatalf("%s: %d lease calls, want 1", c.name, n)
		}
	}
}
