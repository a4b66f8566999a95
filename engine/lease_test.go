package engine_test

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
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
	*fakehost.Call
	s *stream
}

// deliver answers the call as the host would: not at all when the request
// that owns it is gone.
func (c liveCall) deliver(a *engine.Answer) {
	if c.s != nil && c.s.Done {
		return
	}
	c.Answer(a)
}

// newCalls returns the calls sent since the host held from of its own and
// the streams held theirs (from: len of each, in order).
func newCalls(h *fakehost.Host, from int, streams ...*stream) []liveCall {
	var out []liveCall
	for _, c := range h.Calls[from:] {
		out = append(out, liveCall{c, nil})
	}
	for _, s := range streams {
		for _, c := range s.Calls {
			out = append(out, liveCall{c, s})
		}
	}
	return out
}

// grant is a lease answer granting tokens to each bucket of a call.
func grant(tokens ...float64) *engine.Answer {
	a := &wire.LeaseAnswer{Granted: true}
	for _, n := range tokens {
		a.Buckets = append(a.Buckets, wire.Grant{Tokens: n, Remaining: 30, ResetMs: 10000})
	}
	return &engine.Answer{Status: "200", Body: wire.AppendLeaseAnswer(nil, a)}
}

// TestLeaseGrantOutlivesItsRequest: a request waits for its lease call and
// is reset before the answer: the grant goes into the lease all the same,
// so the next request spends from it without a call.
func TestLeaseGrantOutlivesItsRequest(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, leasedFleet)
	s := newStream("k", "a")
	r := p.NewRequest(s)
	if a := r.OnRequestHeaders(); a != engine.Pause {
		t.Fatalf("first request: %v, want a pause on its lease call", a)
	}
	calls := newCalls(h, 0, s)
	if len(calls) != 1 {
		t.Fatalf("%d calls, want the lease call", len(calls))
	}
	s.Done = true // reset: the host ends the request
	r.Done()
	calls[0].deliver(grant(2.5))
	if s.Resumed != 0 || s.Replied != 0 {
		t.Fatalf("the reset request was resumed %d times, replied %d", s.Resumed, s.Replied)
	}
	from := len(h.Calls)
	s2 := newStream("k", "a")
	if a := p.NewRequest(s2).OnRequestHeaders(); a != engine.Continue {
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
		h := fakehost.New()
		p := newPlugin(t, h, leasedFleet)
		s := newStream("k", "a")
		s.DeferRun = true
		r := p.NewRequest(s)
		if a := r.OnRequestHeaders(); a != engine.Pause {
			t.Fatalf("reset %v: first request: %v, want a pause", reset, a)
		}
		calls := newCalls(h, 0, s)
		if len(calls) != 1 {
			t.Fatalf("reset %v: %d calls, want the lease call", reset, len(calls))
		}
		calls[0].deliver(grant(2.5))
		if reset {
			s.Done = true
			r.Done()
		}
		s.RunDeferred()
		want := 2 // whole tokens left for later requests: 2.5 − 1
		if reset {
			want = 2 // 2.5: the reset request took nothing
		} else if s.Resumed != 1 {
			t.Fatalf("the waiting request was resumed %d times, want 1", s.Resumed)
		}
		admitted := 0
		for range 3 {
			si := newStream("k", "a")
			if p.NewRequest(si).OnRequestHeaders() == engine.Continue {
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
	h := fakehost.New()
	p := newPlugin(t, h, leasedFleet)
	s := newStream("k", "a")
	rs := &reused{s.Stream}
	r := p.NewRequest(rs)
	r.OnRequestHeaders()
	first := newCalls(h, 0, s)
	s.Done = true
	r.Done()
	s2 := newStream("k", "b") // another key: its lease is empty
	rs.Stream = s2.Stream     // the host reuses the Request (plugin and native adapters do)
	if a := r.OnRequestHeaders(); a != engine.Pause {
		t.Fatalf("second request: %v, want a pause", a)
	}
	second := newCalls(h, len(first)-len(s.Calls), s2)
	if len(first) != 1 || len(second) != 1 {
		t.Fatalf("calls %d and %d, want one each", len(first), len(second))
	}
	first[0].deliver(grant(2.5))
	if s2.Resumed != 0 || s2.Replied != 0 {
		t.Fatalf("the first request's answer resumed the second (%d) or replied (%d)", s2.Resumed, s2.Replied)
	}
	second[0].deliver(grant(2.5))
	if s2.Resumed != 1 {
		t.Fatalf("the second request's own answer resumed it %d times, want 1", s2.Resumed)
	}
}

// TestLeaseCallTimeouts: lease calls (the one a request waits for, and a
// refill) carry lease_timeout_ms, 500 ms by default; a per-request call
// keeps timeout_ms.
func TestLeaseCallTimeouts(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, leasedFleet)
	s := newStream("k", "a")
	p.NewRequest(s).OnRequestHeaders()
	calls := newCalls(h, 0, s)
	if len(calls) != 1 || calls[0].Call.Call.TimeoutMS != 500 {
		t.Fatalf("lease call timeouts: %d calls, first %+v; want one of 500 ms", len(calls), calls[0].Call)
	}
	calls[0].deliver(grant(2.5))
	from := len(h.Calls)
	p.NewRequest(newStream("k", "a")).OnRequestHeaders() // 1.5 → 0.5: claims the refill
	refill := newCalls(h, from)
	if len(refill) != 1 || refill[0].Call.Call.TimeoutMS != 500 {
		t.Fatalf("refill: %d calls; want one of 500 ms", len(refill))
	}
	h2 := fakehost.New()
	p2 := newPlugin(t, h2, fleet)
	s2 := newStream()
	p2.NewRequest(s2).OnRequestHeaders()
	if c := newCalls(h2, 0, s2); len(c) != 1 || c[0].Call.Call.TimeoutMS != 25 {
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
	h := fakehost.New()
	p := newPlugin(t, h, stackedLeases)
	// a's lease gets 25 tokens; the request takes 1.
	s := newStream("k", "x")
	p.NewRequest(s).OnRequestHeaders()
	c := newCalls(h, 0, s)
	if len(c) != 1 {
		t.Fatalf("%d calls, want a's lease call", len(c))
	}
	c[0].deliver(grant(25))
	// b's lease is empty: the request waits for b's call, which fails.
	from := len(h.Calls)
	s = newStream("k", "x", "b", "1")
	if a := p.NewRequest(s).OnRequestHeaders(); a != engine.Pause {
		t.Fatalf("a request on both rules: %v, want a pause on b's call", a)
	}
	c = newCalls(h, from, s)
	if len(c) != 1 {
		t.Fatalf("%d calls, want b's lease call", len(c))
	}
	c[0].deliver(&engine.Answer{Failed: true})
	if s.Resumed != 1 || s.Replied != 0 {
		t.Fatalf("resumed %d, replied %d: want the request to go on (allow)", s.Resumed, s.Replied)
	}
	check := func(when string, aAllowed, aOpen, bOpen int64) {
		t.Helper()
		if got := [3]int64{h.Count("rule.a.allowed"), h.Count("rule.a.failed_open"), h.Count("rule.b.failed_open")}; got != [3]int64{aAllowed, aOpen, bOpen} {
			t.Fatalf("%s: a allowed, a failed_open, b failed_open = %v; want %v", when, got, [3]int64{aAllowed, aOpen, bOpen})
		}
	}
	check("b's call failed", 2, 0, 1)
	// Within the second: b passes unchecked at once, with no call; a's
	// lease is spent.
	h.Clock.Advance(500e6)
	from = len(h.Calls)
	s = newStream("k", "x", "b", "1")
	if a := p.NewRequest(s).OnRequestHeaders(); a != engine.Continue || len(newCalls(h, from, s)) != 0 {
		t.Fatalf("within the failure window: %v with %d calls; want the request admitted, no call", a, len(newCalls(h, from, s)))
	}
	check("within the window", 3, 0, 2)
	// a's lease held 25 and three requests spent from it: 22 more pass.
	admitted := 0
	for range 30 {
		if p.NewRequest(newStream("k", "x")).OnRequestHeaders() == engine.Continue {
			admitted++
		}
	}
	if admitted != 22 {
		t.Fatalf("a alone: %d admitted from what its lease holds, want 22", admitted)
	}
	// After the second, b's lease asks again.
	h.Clock.Advance(600e6)
	from = len(h.Calls)
	s = newStream("k", "x", "b", "1")
	if a := p.NewRequest(s).OnRequestHeaders(); a != engine.Pause || len(newCalls(h, from, s)) == 0 {
		t.Fatalf("after the window: %v, want a pause on a lease call", a)
	}
}

// TestLeaseFailureAfterAGrantLanded: two requests wait for lease calls on
// one lease; the first call's grant lands, the second call fails: the
// second request spends from the lease (failure_mode deny would otherwise
// refuse it).
func TestLeaseFailureAfterAGrantLanded(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, leasedFleet)
	s1, s2 := newStream("k", "a"), newStream("k", "a")
	p.NewRequest(s1).OnRequestHeaders()
	c1 := newCalls(h, 0, s1)
	from := len(h.Calls)
	p.NewRequest(s2).OnRequestHeaders()
	c2 := newCalls(h, from, s2)
	if len(c1) != 1 || len(c2) != 1 {
		t.Fatalf("calls %d and %d, want each request waiting for one", len(c1), len(c2))
	}
	c1[0].deliver(grant(2.5))
	if s1.Resumed != 1 {
		t.Fatalf("first request resumed %d times", s1.Resumed)
	}
	c2[0].deliver(&engine.Answer{Failed: true})
	if s2.Resumed != 1 || s2.Replied != 0 {
		t.Fatalf("second request: resumed %d, replied %d; want it admitted from the lease its call found refilled", s2.Resumed, s2.Replied)
	}
	if h.Count("rule.fleet.allowed") != 2 {
		t.Fatalf("allowed %d, want 2", h.Count("rule.fleet.allowed"))
	}
}

// TestLeaseAnsweredWithinTheCall: a host answers the plugin's lease call
// before handing it off returns; the request never pauses, and is decided
// from the answer as recorded: a grant admits it, a failure applies
// failure_mode, with no second call.
func TestLeaseAnsweredWithinTheCall(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer *engine.Answer
		want   engine.Action
		status int
	}{
		{"granted", grant(2.5), engine.Continue, 0},
		{"failed: deny", &engine.Answer{Failed: true}, engine.Pause, 429},
	} {
		h := fakehost.New()
		p := newPlugin(t, h, leasedFleet)
		h.AtOnce = c.answer
		s := newStream("k", "a")
		if a := p.NewRequest(s).OnRequestHeaders(); a != c.want || s.Replied != c.status || s.Resumed != 0 {
			t.Fatalf("%s: action %v, replied %d, resumed %d; want %v and %d", c.name, a, s.Replied, s.Resumed, c.want, c.status)
		}
		if n := h.Count("lease_calls"); n != 1 {
			t.Fatalf("%s: %d lease calls, want 1", c.name, n)
		}
	}
}

// leased is one leased cluster rule by header k: burst 40, 1 token/s.
const leased = `{"service": {"cluster": "limitd", "timeout_ms": 30},
 "rules": [{"name": "fleet", "scope": "cluster", "sync": "lease", "limit_keys": ["header:k"],
   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 40}}]}`

// burst is cfg with the burst 40 of its rule changed.
func burst(cfg, b string) string { return strings.Replace(cfg, `"burst": 40`, `"burst": `+b, 1) }

// TestLeaseTimelines: requests against a real limit service through
// leases: what each client sees and whether it waited for a call.
func TestLeaseTimelines(t *testing.T) {
	b := []string{"k", "b"}
	run(t, []timeline{
		// Once the global bucket refused, requests that find no token are
		// refused without a call until its wait is over.
		{name: "refused: waits locally", limitd: true, cfg: burst(leased, "2"), steps: []exchange{
			{times: 2, req: b, status: 200},
			{req: b, status: 429, calls: 1},
			{req: b, status: 429, noCall: true, headers: map[string]string{"retry-after": "1|2"}},
			{wait: sec, req: b, status: 200}}},
		// The wall clock steps back 300 s after the global bucket refused:
		// the lease asks again rather than answering 429 for the step's
		// length (the bucket, on limitd's clock, refilled meanwhile).
		{name: "a clock step back does not freeze the lease", limitd: true, cfg: burst(leased, "2"), steps: []exchange{
			{times: 2, req: b, status: 200},
			{req: b, status: 429},
			{wait: -298 * sec, req: b, calls: 1}}},
		// A request refused by a lease that answers alone (the global bucket
		// refused lately) gives its local rules' tokens back.
		{name: "a refusal gives the local tokens back", limitd: true, cfg: `{"service": {"cluster": "limitd"}, "rules": [
	  {"name": "local", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
	  {"name": "fleet", "scope": "cluster", "sync": "lease", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`,
			steps: []exchange{
				{times: 2, status: 200},
				{status: 429, body: `"rule":"fleet"`},               // refused by a call
				{status: 429, body: `"rule":"fleet"`, noCall: true}, // by the lease alone
				{wait: 2 * sec, status: 200}}},
		// After x-cost 1000 is refused, a request of cost 100 still asks the
		// limit service, which holds enough, instead of inheriting the
		// refused request's 429 and wait.
		{name: "a refusal judges each cost", limitd: true, cfg: `{"service": {"cluster": "limitd", "timeout_ms": 30},
	 "rules": [{"name": "fleet", "scope": "cluster", "sync": "lease", "algorithm": "token_bucket",
	   "algorithm_config": {"tokens_per_second": 1, "burst": 1000, "cost_source": "header:x-cost"}}]}`,
			steps: []exchange{
				{req: []string{"x-cost", "63"}, status: 200}, // the global bucket holds 937 then
				{req: []string{"x-cost", "1000"}, status: 429},
				{req: []string{"x-cost", "100"}, status: 200, calls: 1}}},
	})
}

// TestLeaseExactAndLocal: a burst of 40 admits at most 40 (and at least 36,
// the rest being fractions left in the lease), most requests make no call,
// and the lease's leftover goes back to the global bucket once it expires.
func TestLeaseExactAndLocal(t *testing.T) {
	w := newWorld(t, leased).withLimitd()
	admitted := 0
	for range 100 {
		r := w.do("k", "a")
		switch {
		case r.status == 200 && r.headers["ratelimit"] == "":
			t.Fatalf("an admitted request has no RateLimit header: %v", r.headers)
		case r.status == 200:
			admitted++
		case r.status != 429 || r.headers["retry-after"] == "" || r.headers["x-ratelimit-reason"] != "token_bucket_exceeded":
			t.Fatalf("rejection %+v", r)
		}
	}
	if admitted > 40 || admitted < 36 {
		t.Fatalf("admitted %d of a burst of 40, want 36 to 40", admitted)
	}
	if got := w.count("lease_calls"); got > 30 {
		t.Errorf("%d lease calls for 100 requests", got)
	}
	// After the ttl, the tick returns what is left; the global bucket has
	// it again (and has refilled by then).
	w.h.Clock.Advance(3 * sec)
	w.tick()
	before := admitted
	for range 10 {
		if r := w.do("k", "a"); r.status == 200 {
			admitted++
		}
	}
	if got := admitted - before; got < 3 || got > 4 {
		t.Errorf("after 3 s at 1 token/s (and the returned fraction): %d admitted, want 3 or 4", got)
	}
}

// TestLeaseOutage: while the service fails, leases in hand are spent, then
// failure_mode applies (without a call for each request), and leases
// resume when it is back.
func TestLeaseOutage(t *testing.T) {
	for _, mode := range []string{"allow", "deny"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t, strings.Replace(leased, `"timeout_ms": 30`, `"timeout_ms": 30, "failure_mode": "`+mode+`"`, 1)).withLimitd()
			if r := w.do("k", "c"); r.status != 200 { // leases 2.5 (a quarter of max_share × burst), spends 1
				t.Fatalf("first request: %d", r.status)
			}
			w.limitd.down = true
			passed, last := 0, seen{}
			for range 6 {
				if last = w.do("k", "c"); last.status != 200 {
					break
				}
				passed++
			}
			failedOpen := w.count("rule.fleet.failed_open")
			switch {
			case mode == "deny" && (passed != 1 || last.status != 429 || last.headers["x-ratelimit-reason"] != "limit_service_unavailable"):
				t.Fatalf("deny: %d passed on the lease (want the 1 whole token in it), then %+v", passed, last)
			case mode == "allow" && (passed != 6 || failedOpen != 5):
				t.Fatalf("allow: %d passed, %d failed open; want 6 and 5 (1 on the lease)", passed, failedOpen)
			}
			if r := w.do("k", "c"); r.calls != 0 {
				t.Fatal("a request called the failing service again within a second")
			}
			w.limitd.down = false
			w.h.Clock.Advance(2 * sec)
			if r := w.do("k", "c"); r.status != 200 || r.calls == 0 {
				t.Fatalf("service back: %d after %d calls, want 200 after a lease call", r.status, r.calls)
			}
		})
	}
}

// TestLeaseStacks: a request takes from all its leases or none; with a
// per-request cluster rule that refuses, it gets its leased token back.
func TestLeaseStacks(t *testing.T) {
	const wide = `{"name": "wide", "scope": "cluster", "sync": "lease", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 100}}`
	for _, tc := range []struct {
		name, narrow string
		min          int // of wide's 100, at least this many admitted in all
	}{
		{"leased beside leased", `"sync": "lease", `, 96},
		{"leased beside per-request", ``, 97},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, `{"service": {"cluster": "limitd"}, "rules": [`+wide+`,
	  {"name": "narrow", "scope": "cluster", `+tc.narrow+`"limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 3}}]}`).withLimitd()
			admitted := 0
			for range 23 { // narrow admits 3: none of its refusals may take from wide
				r := w.do("k", "x")
				switch {
				case r.status == 200:
					admitted++
				case r.headers["x-ratelimit-reason"] != "token_bucket_exceeded" || !strings.Contains(r.body, `"rule":"narrow"`):
					t.Fatalf("rejection %+v, want narrow's", r)
				}
			}
			if admitted != 3 {
				t.Fatalf("key x: %d admitted, want narrow's burst of 3", admitted)
			}
			for i := range 200 {
				if r := w.do("k", "y"+strconv.Itoa(i)); r.status == 200 {
					admitted++
				}
			}
			if admitted < tc.min || admitted > 100 {
				t.Fatalf("wide admitted %d of 100 in all: x's 20 refusals must not have taken any", admitted)
			}
		})
	}
}

// TestLeaseWaitSendsShadows: a request that waits for a lease call still
// sends its shadow cluster rule: the rollout measures the slow path too.
func TestLeaseWaitSendsShadows(t *testing.T) {
	w := newWorld(t, `{"service": {"cluster": "limitd", "timeout_ms": 30}, "rules": [
	  {"name": "trial", "mode": "shadow", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 1}},
	  {"name": "fleet", "scope": "cluster", "sync": "lease", "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 40}}]}`).withLimitd()
	if sts := w.statuses(3, "k", "a"); count(sts, 200) != 3 {
		t.Fatalf("statuses %v", sts)
	}
	if got := w.count("rule.trial.allowed") + w.count("rule.trial.shadow_rejected"); got != 3 {
		t.Fatalf("the shadow rule decided %d of 3 requests (allowed %d, shadow_rejected %d)", got,
			w.count("rule.trial.allowed"), w.count("rule.trial.shadow_rejected"))
	}
}

// TestLeaseEvictionsCounted: leases evicted with tokens in hand count in
// tokenbucket.evictions, as the docs say.
func TestLeaseEvictionsCounted(t *testing.T) {
	w := newWorld(t, strings.Replace(leased, `"rules"`, `"max_keys": 16, "rules"`, 1)).withLimitd()
	for i := range 200 {
		w.statuses(2, "k", strconv.Itoa(i)) // a second call: a sized lease, tokens in hand
	}
	if w.count("evictions") == 0 {
		t.Fatal("200 keys through 16 lease slots, no eviction counted")
	}
}

// leaseCallBuckets counts the plugin's lease calls and the buckets they
// carry, from call index from on.
func (w *world) leaseCallBuckets(from int) (calls, buckets, most int) {
	for _, c := range w.h.Calls[from:] {
		body := string(c.Call.Body)
		if !strings.Contains(body, `"want"`) && !strings.Contains(body, `"return"`) {
			continue
		}
		n := strings.Count(body, `"key":`)
		calls, buckets, most = calls+1, buckets+n, max(most, n)
	}
	return calls, buckets, most
}

// TestLeaseReturnsBounded: a flood of distinct keys on a leased rule costs
// one lease call per key, and their leftovers go back in calls of 16
// leases, instead of a return call per key; with a thousand expired leases
// held, one tick looks at a bounded number of them, later ticks return
// the rest.
func TestLeaseReturnsBounded(t *testing.T) {
	t.Run("500 keys seen once", func(t *testing.T) {
		w := newWorld(t, burst(leased, "100")).withLimitd()
		for i := range 500 {
			if r := w.do("k", "flood-"+strconv.Itoa(i)); r.status != 200 {
				t.Fatalf("key %d: %d", i, r.status)
			}
		}
		before := w.count("lease_calls")
		w.h.Clock.Advance(3 * sec)
		for range 3 {
			w.tick()
		}
		if calls := w.count("lease_calls"); before > 500 || calls-before > 32 {
			t.Fatalf("%d lease calls, then %d return calls; want 500, then at most 32 (16 leases a call)", before, calls-before)
		}
	})
	t.Run("1000 expired leases", func(t *testing.T) {
		w := newWorld(t, burst(leased, "100")).withLimitd()
		for i := range 1000 {
			w.do("k", "busy-"+strconv.Itoa(i)) // leases 6.25, spends 1: 5.25 to return
		}
		w.h.Clock.Advance(3 * sec)
		from := len(w.h.Calls)
		w.p.Tick(&runtime.MemStats{})
		calls, buckets, most := w.leaseCallBuckets(from)
		if calls > 16 || most > 16 || buckets > 256 || buckets == 0 {
			t.Fatalf("one tick: %d return calls over %d leases (at most %d in one); want at most 16 calls of at most 16", calls, buckets, most)
		}
		total := buckets
		for range 10 {
			w.limitd.serve()
			from = len(w.h.Calls)
			w.p.Tick(&runtime.MemStats{})
			_, b, _ := w.leaseCallBuckets(from)
			total += b
		}
		if total != 1000 {
			t.Fatalf("%d leases returned over 11 ticks, want all 1000", total)
		}
	})
}

// TestRefillFailureDoesNotFailOpen: a detached refill that fails (limitd
// overloaded by a flood of other keys) does not mark the lease down: the
// next request that finds it short asks the service itself, rather than
// passing unchecked under failure_mode allow for a second.
func TestRefillFailureDoesNotFailOpen(t *testing.T) {
	w := newWorld(t, leased).withLimitd()
	w.do("k", "hot") // leases 2.5, spends 1
	w.limitd.down = true
	if r := w.do("k", "hot"); r.status != 200 { // spends 1 of 1.5: claims the refill, which fails
		t.Fatalf("second request: %d", r.status)
	}
	if w.count("service_errors") != 1 {
		t.Fatalf("service_errors %d, want the failed refill", w.count("service_errors"))
	}
	w.limitd.down = false
	if r := w.do("k", "hot"); r.status != 200 || r.calls == 0 || w.count("rule.fleet.failed_open") != 0 {
		t.Fatalf("after a failed refill: %d after %d calls, failed_open %d; want 200 after a call, none failed open",
			r.status, r.calls, w.count("rule.fleet.failed_open"))
	}
}
