package plugin

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/service"
)

const leased = `{"service": {"cluster": "limitd", "timeout_ms": 30},
 "rules": [{"name": "fleet", "scope": "cluster", "sync": "lease", "limit_keys": ["header:k"],
   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 40}}]}`

// limitd is a real limit service (service.Server on a memory store on the
// emulator's clock) that answers the plugin's callouts.
type limitd struct {
	e      *emulator
	srv    http.Handler
	served map[uint32]int // callouts answered per context (the emulator reuses callout ids)
	calls  int
	down   bool // answer every call with a failure
}

func newLimitd(t *testing.T, e *emulator) *limitd {
	srv, err := service.NewServer(service.Config{Store: service.NewMemoryStore(service.MemoryOptions{Now: e.clk.now})})
	if err != nil {
		t.Fatal(err)
	}
	return &limitd{e: e, srv: srv, served: map[uint32]int{}}
}

// serve answers every unanswered callout of the contexts ids and of the
// plugin context, until none is left; it returns how many it answered.
func (l *limitd) serve(ids ...uint32) int {
	n := 0
	for more := true; more; {
		more = false
		for _, id := range append(ids, proxytest.PluginContextID) {
			for _, c := range l.e.host.GetCalloutAttributesFromContext(id)[l.served[id]:] {
				l.served[id]++
				more = true
				n++
				l.calls++
				if l.down {
					l.e.host.CallOnHttpCallResponse(c.CalloutID, nil, nil, nil)
					continue
				}
				hs := map[string]string{}
				for _, h := range c.Headers {
					hs[h[0]] = h[1]
				}
				r := httptest.NewRequest(hs[":method"], hs[":path"], bytes.NewReader(c.Body))
				w := httptest.NewRecorder()
				l.srv.ServeHTTP(w, r)
				l.e.host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, w.Body.Bytes())
			}
		}
	}
	return n
}

// do runs one request with the limit service answering its calls, and
// reports what the client saw and how many calls it took.
func (l *limitd) do(headers ...string) (response, int) {
	e := l.e
	e.t.Helper()
	id := e.host.InitializeHttpContext()
	e.host.CallOnRequestHeaders(id, requestHeaders(headers), false)
	calls := l.serve(id)
	var r response
	if lr := e.host.GetSentLocalResponse(id); lr != nil {
		r = response{status: int(lr.StatusCode), body: string(lr.Data), headers: map[string]string{}}
		for _, h := range lr.Headers {
			r.headers[h[0]] = h[1]
		}
	} else {
		if a := e.host.GetCurrentHttpStreamAction(id); a != types.ActionContinue {
			e.t.Fatalf("request neither answered nor continued: %v", a)
		}
		e.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
		r = response{status: 200, headers: map[string]string{}}
		for _, h := range e.host.GetCurrentResponseHeaders(id)[1:] {
			r.headers[h[0]] = h[1]
		}
	}
	e.host.CompleteHttpContext(id)
	return r, calls
}

// TestLeaseExactAndLocal: a burst of 40 admits at most 40 (and at least 36,
// the rest being fractions left in the lease), most requests make no call,
// and the lease's leftover goes back to the global bucket once it expires.
func TestLeaseExactAndLocal(t *testing.T) {
	e := start(t, leased)
	l := newLimitd(t, e)
	admitted, blocking := 0, 0
	for range 100 {
		r, calls := l.do("k", "a")
		if r.status == 200 {
			admitted++
			if r.headers["ratelimit"] == "" {
				t.Fatalf("an admitted request has no RateLimit header: %v", r.headers)
			}
		} else if r.status != 429 || r.headers["retry-after"] == "" || r.headers["x-ratelimit-reason"] != "token_bucket_exceeded" {
			t.Fatalf("rejection %+v", r)
		}
		if calls > 0 {
			blocking++
		}
	}
	if admitted > 40 || admitted < 36 {
		t.Fatalf("admitted %d of a burst of 40, want 36 to 40", admitted)
	}
	if got := e.counter("lease_calls"); got > 30 {
		t.Errorf("%d lease calls for 100 requests", got)
	}
	t.Logf("admitted %d, lease calls %d (%d requests saw a call answered)", admitted, e.counter("lease_calls"), blocking)

	// After the ttl, the tick returns what is left; the global bucket has
	// it again (and has refilled by then).
	e.clk.t += 3 * sec
	e.host.Tick()
	l.serve()
	before := admitted
	for range 10 {
		if r, _ := l.do("k", "a"); r.status == 200 {
			admitted++
		}
	}
	if got := admitted - before; got < 3 || got > 4 {
		t.Errorf("after 3 s at 1 token/s (and the returned fraction): %d admitted, want 3 or 4", got)
	}
}

// TestLeaseRefusedWaitsLocally: once the global bucket refused, requests
// that find no token are refused without a call until its wait is over.
func TestLeaseRefusedWaitsLocally(t *testing.T) {
	cfg := strings.Replace(leased, `"burst": 40`, `"burst": 2`, 1)
	e := start(t, cfg)
	l := newLimitd(t, e)
	for range 2 {
		if r, _ := l.do("k", "b"); r.status != 200 {
			t.Fatalf("status %d within the burst", r.status)
		}
	}
	r, calls := l.do("k", "b")
	if r.status != 429 || calls != 1 {
		t.Fatalf("over the burst: %d after %d calls, want 429 after 1", r.status, calls)
	}
	r, calls = l.do("k", "b")
	if r.status != 429 || calls != 0 || r.headers["retry-after"] < "1" {
		t.Fatalf("within the wait: %d after %d calls (%v), want 429 without a call", r.status, calls, r.headers)
	}
	e.clk.t += 1 * sec
	if r, _ := l.do("k", "b"); r.status != 200 {
		t.Fatalf("after the wait: %d, want 200", r.status)
	}
}

// TestLeaseOutage: while the service fails, leases in hand are spent, then
// failure_mode applies (without a call for each request), and leases
// resume when it is back.
func TestLeaseOutage(t *testing.T) {
	for _, mode := range []string{"allow", "deny"} {
		t.Run(mode, func(t *testing.T) {
			cfg := strings.Replace(leased, `"timeout_ms": 30`, `"timeout_ms": 30, "failure_mode": "`+mode+`"`, 1)
			e := start(t, cfg)
			l := newLimitd(t, e)
			if r, _ := l.do("k", "c"); r.status != 200 { // leases 2.5 (a quarter of max_share × burst), spends 1
				t.Fatalf("first request: %d", r.status)
			}
			l.down = true
			passed, last := 0, response{}
			for range 6 {
				if last, _ = l.do("k", "c"); last.status != 200 {
					break
				}
				passed++
			}
			failedOpen := e.counter("rule.fleet.failed_open")
			switch {
			case mode == "deny" && (passed != 1 || last.status != 429 || last.headers["x-ratelimit-reason"] != "limit_service_unavailable"):
				t.Fatalf("deny: %d passed on the lease (want the 1 whole token in it), then %+v", passed, last)
			case mode == "allow" && (passed != 6 || failedOpen != 5):
				t.Fatalf("allow: %d passed, %d failed open; want 6 and 5 (1 on the lease)", passed, failedOpen)
			}
			calls := l.calls
			l.do("k", "c")
			if l.calls != calls {
				t.Fatal("a request called the failing service again within a second")
			}
			l.down = false
			e.clk.t += 2 * sec
			if r, n := l.do("k", "c"); r.status != 200 || n == 0 {
				t.Fatalf("service back: %d after %d calls, want 200 after a lease call", r.status, n)
			}
		})
	}
}

// TestLeaseStackedAtomic: a request takes from all its leases or none.
func TestLeaseStackedAtomic(t *testing.T) {
	cfg := `{"service": {"cluster": "limitd"}, "rules": [
	  {"name": "wide", "scope": "cluster", "sync": "lease", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 100}},
	  {"name": "narrow", "scope": "cluster", "sync": "lease", "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 3}}]}`
	e := start(t, cfg)
	l := newLimitd(t, e)
	for i := range 3 {
		if r, _ := l.do("k", "x"); r.status != 200 {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	for range 20 { // narrow is out: none of these may take from wide
		if r, _ := l.do("k", "x"); r.status != 429 {
			t.Fatalf("narrow exhausted, status %d", r.status)
		}
	}
	admitted := 3
	for i := range 200 {
		if r, _ := l.do("k", "y"+string(rune('a'+i%26))+string(rune('a'+i/26))); r.status == 200 {
			admitted++
		}
	}
	if admitted < 96 || admitted > 100 {
		t.Fatalf("wide admitted %d of 100 (3 by x; x's 20 refusals must not have taken any)", admitted)
	}
}

// TestLeaseWithPerRequestRule: a request with a leased rule and a
// per-request cluster rule that refuses gets its leased token back.
func TestLeaseWithPerRequestRule(t *testing.T) {
	cfg := `{"service": {"cluster": "limitd"}, "rules": [
	  {"name": "wide", "scope": "cluster", "sync": "lease", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 100}},
	  {"name": "narrow", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`
	e := start(t, cfg)
	l := newLimitd(t, e)
	admitted := 0
	for range 10 {
		r, _ := l.do("k", "x")
		switch {
		case r.status == 200:
			admitted++
		case r.headers["x-ratelimit-reason"] != "token_bucket_exceeded" || !strings.Contains(r.body, `"rule":"narrow"`):
			t.Fatalf("rejection %+v, want narrow's", r)
		}
	}
	if admitted != 2 {
		t.Fatalf("key x: %d admitted, want narrow's burst of 2", admitted)
	}
	for i := range 120 {
		if r, _ := l.do("k", "y"+strconv.Itoa(i)); r.status == 200 {
			admitted++
		}
	}
	if admitted < 97 || admitted > 100 {
		t.Fatalf("wide admitted %d of 100 in all: the 8 requests narrow refused must have given their leased tokens back", admitted)
	}
}

// TestLeaseRefusalRefundsLocal: a request refused by a lease that answers
// alone (the global bucket refused lately) gives its local rules' tokens
// back.
func TestLeaseRefusalRefundsLocal(t *testing.T) {
	cfg := `{"service": {"cluster": "limitd"}, "rules": [
	  {"name": "local", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
	  {"name": "fleet", "scope": "cluster", "sync": "lease", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`
	e := start(t, cfg)
	l := newLimitd(t, e)
	want := []int{200, 200, 429, 429} // the third is refused by a call, the fourth by the lease alone
	for i, w := range want {
		if r, _ := l.do(); r.status != w || w == 429 && !strings.Contains(r.body, `"rule":"fleet"`) {
			t.Fatalf("request %d: %+v, want %d", i, r, w)
		}
	}
	e.clk.t += 2 * sec
	if r, _ := l.do(); r.status != 200 {
		t.Fatalf("after the wait: %+v; the refused requests kept the local rule's last token", r)
	}
}

// TestLeaseRefusalJudgesEachCost: after x-cost 1000 is refused on a leased
// rule, a request of cost 100 still asks the limit service, which holds
// enough, instead of inheriting the refused request's 429 and wait.
func TestLeaseRefusalJudgesEachCost(t *testing.T) {
	e := start(t, `{"service": {"cluster": "limitd", "timeout_ms": 30},
	 "rules": [{"name": "fleet", "scope": "cluster", "sync": "lease", "algorithm": "token_bucket",
	   "algorithm_config": {"tokens_per_second": 1, "burst": 1000, "cost_source": "header:x-cost"}}]}`)
	l := newLimitd(t, e)
	if r, _ := l.do("x-cost", "63"); r.status != 200 { // the global bucket holds 937 then
		t.Fatalf("first request: %+v", r)
	}
	if r, _ := l.do("x-cost", "1000"); r.status != 429 {
		t.Fatalf("cost 1000 against 937: %+v, want 429", r)
	}
	r, calls := l.do("x-cost", "100")
	if r.status != 200 || calls == 0 {
		t.Fatalf("cost 100 after the refusal: %d after %d calls (%v), want 200 after a call", r.status, calls, r.headers)
	}
}

// TestLeaseWaitSendsShadows: a request that waits for a lease call still
// sends its shadow cluster rule: the rollout measures the slow path too.
func TestLeaseWaitSendsShadows(t *testing.T) {
	e := start(t, `{"service": {"cluster": "limitd", "timeout_ms": 30}, "rules": [
	  {"name": "trial", "mode": "shadow", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 1}},
	  {"name": "fleet", "scope": "cluster", "sync": "lease", "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 40}}]}`)
	l := newLimitd(t, e)
	for range 3 {
		if r, _ := l.do("k", "a"); r.status != 200 {
			t.Fatalf("status %d", r.status)
		}
	}
	if got := e.counter("rule.trial.allowed") + e.counter("rule.trial.shadow_rejected"); got != 3 {
		t.Fatalf("the shadow rule decided %d of 3 requests (allowed %d, shadow_rejected %d)", got,
			e.counter("rule.trial.allowed"), e.counter("rule.trial.shadow_rejected"))
	}
}

// TestClockStepBackDoesNotFreezeLease: the wall clock steps back 300 s
// after the global bucket refused; the lease asks again within a second
// of the step rather than answering 429 for the step's length.
func TestClockStepBackDoesNotFreezeLease(t *testing.T) {
	cfg := strings.Replace(leased, `"burst": 40`, `"burst": 2`, 1)
	e := start(t, cfg)
	l := newLimitd(t, e)
	for range 3 {
		l.do("k", "b") // 200, 200, then refused by the global bucket
	}
	e.clk.t -= 300 * sec
	e.clk.t += 2 * sec // the bucket (on limitd's own clock) refills meanwhile
	l.e.clk.t += 0
	r, calls := l.do("k", "b")
	if calls == 0 {
		t.Fatalf("after a backward step: %d without a call (retry-after %s), want a call", r.status, r.headers["retry-after"])
	}
}

// TestLeaseEvictionsCounted: leases evicted with tokens in hand count in
// tokenbucket.evictions, as the docs say.
func TestLeaseEvictionsCounted(t *testing.T) {
	cfg := strings.Replace(leased, `"rules"`, `"max_keys": 16, "rules"`, 1)
	e := start(t, cfg)
	l := newLimitd(t, e)
	for i := range 200 {
		l.do("k", strconv.Itoa(i))
		l.do("k", strconv.Itoa(i)) // a second call: a sized lease, tokens in hand
	}
	if e.counter("evictions") == 0 {
		t.Fatal("200 keys through 16 lease slots, no eviction counted")
	}
}

// leaseCallBuckets counts the plugin context's lease calls and the buckets
// they carry, from callout index from on.
func (e *emulator) leaseCallBuckets(from int) (calls, buckets, most int) {
	for _, c := range e.host.GetCalloutAttributesFromContext(proxytest.PluginContextID)[from:] {
		if !strings.Contains(string(c.Body), `"want"`) && !strings.Contains(string(c.Body), `"return"`) {
			continue
		}
		n := strings.Count(string(c.Body), `"key":`)
		calls, buckets, most = calls+1, buckets+n, max(most, n)
	}
	return calls, buckets, most
}

// TestKeyFloodCallsPerRequest: a flood of distinct keys on a leased rule
// costs one lease call per key, and their leftovers go back in calls of 16
// leases, instead of a return call per key.
func TestKeyFloodCallsPerRequest(t *testing.T) {
	e := start(t, strings.Replace(leased, `"burst": 40`, `"burst": 100`, 1))
	l := newLimitd(t, e)
	for i := range 500 {
		if r, _ := l.do("k", "flood-"+strconv.Itoa(i)); r.status != 200 {
			t.Fatalf("key %d: %d", i, r.status)
		}
	}
	before := e.counter("lease_calls")
	e.clk.t += 3 * sec
	for range 3 {
		e.host.Tick()
		l.serve()
	}
	if calls := e.counter("lease_calls"); before > 500 || calls-before > 32 {
		t.Fatalf("500 keys seen once: %d lease calls, then %d return calls; want 500, then at most 32 (16 leases a call)", before, calls-before)
	}
}

// TestTickBounded: with a thousand expired leases held, one tick looks at a
// bounded number of them and returns them in calls of at most 16 buckets;
// later ticks return the rest.
func TestTickBounded(t *testing.T) {
	e := start(t, strings.Replace(leased, `"burst": 40`, `"burst": 100`, 1))
	l := newLimitd(t, e)
	for i := range 1000 {
		l.do("k", "busy-"+strconv.Itoa(i)) // leases 6.25, spends 1: 5.25 to return
	}
	e.clk.t += 3 * sec
	from := len(e.host.GetCalloutAttributesFromContext(proxytest.PluginContextID))
	e.host.Tick()
	calls, buckets, most := e.leaseCallBuckets(from)
	if calls > 16 || most > 16 || buckets > 256 || buckets == 0 {
		t.Fatalf("one tick: %d return calls over %d leases (at most %d in one); want at most 16 calls of at most 16", calls, buckets, most)
	}
	total := buckets
	for range 10 {
		l.serve()
		from = len(e.host.GetCalloutAttributesFromContext(proxytest.PluginContextID))
		e.host.Tick()
		_, b, _ := e.leaseCallBuckets(from)
		total += b
	}
	if total != 1000 {
		t.Fatalf("%d leases returned over 11 ticks, want all 1000", total)
	}
}

// TestRefillFailureDoesNotFailOpen: a detached refill that fails (limitd
// overloaded by a flood of other keys) does not mark the lease down: the
// next request that finds it short asks the service itself, rather than
// passing unchecked under failure_mode allow for a second.
func TestRefillFailureDoesNotFailOpen(t *testing.T) {
	e := start(t, leased)
	l := newLimitd(t, e)
	l.do("k", "hot") // leases 2.5, spends 1
	l.down = true
	if r, _ := l.do("k", "hot"); r.status != 200 { // spends 1 of 1.5: claims the refill, which fails
		t.Fatalf("second request: %d", r.status)
	}
	if e.counter("service_errors") != 1 {
		t.Fatalf("service_errors %d, want the failed refill", e.counter("service_errors"))
	}
	l.down = false
	r, calls := l.do("k", "hot")
	if r.status != 200 || calls == 0 || e.counter("rule.fleet.failed_open") != 0 {
		t.Fatalf("after a failed refill: %d after %d calls, failed_open %d; want 200 after a call, none failed open",
			r.status, calls, e.counter("rule.fleet.failed_open"))
	}
}
