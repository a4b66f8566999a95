package plugin

// The request's ends and what it took: each test reproduces one way a
// request or its leases could admit more, or refuse more, than its buckets
// say (the review of the lease and response-cost paths).

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

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

// TestChargeEqualToReservationShowsBucket: a response whose cost equals
// the reservation charges nothing, and the headers show the bucket as it
// is, not full.
func TestChargeEqualToReservationShowsBucket(t *testing.T) {
	e := start(t, budget("response_header:x-usage", `"default_cost": 10`, ""))
	var got []string
	for range 3 {
		r := e.doUpstream(upstream{status: "200", headers: [][2]string{{"x-usage", "10"}}}, "x-api-key", "a")
		got = append(got, r.headers["ratelimit-remaining"])
	}
	if strings.Join(got, " ") != "90 80 70" {
		t.Fatalf("ratelimit-remaining %v, want 90 80 70", got)
	}
}

// TestNoChargeCallOfZero: a cluster rule whose cost the response does not
// report (or reports equal to the reservation) sends no charge call.
func TestNoChargeCallOfZero(t *testing.T) {
	e := start(t, `{"service": {"cluster": "limitd", "timeout_ms": 30},
	 "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:k"],
	   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 100,
	   "cost_source": "response_header:x-usage", "default_cost": 5}}]}`)
	l := newLimitd(t, e)
	l.doCharged("200", nil, "k", "a")
	l.doCharged("200", [][2]string{{"x-usage", "5"}}, "k", "a")
	if n := e.counter("charge_calls"); n != 0 {
		t.Fatalf("%d charge calls for nothing to charge", n)
	}
}

// TestClusterChargeClamped: a charge far above what can change a bucket is
// sent clamped to twice the burst (limitd refuses amounts above 10^9: the
// debt would be lost whole).
func TestClusterChargeClamped(t *testing.T) {
	e := start(t, `{"service": {"cluster": "limitd", "timeout_ms": 30},
	 "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:k"],
	   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 100,
	   "cost_source": "response_header:x-usage"}}]}`)
	l := newLimitd(t, e)
	l.doCharged("200", [][2]string{{"x-usage", "2e9"}}, "k", "a")
	if n := e.counter("service_errors"); n != 0 {
		t.Fatalf("the charge call failed (%d service errors): the debt was lost", n)
	}
	if st := l.doCharged("200", nil, "k", "a"); st != 429 {
		t.Fatalf("after a charge of 2e9 against a burst of 100: %d, want 429", st)
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

// failSets fails every Set with a host error while on.
type failSets struct {
	sharedData
	on bool
}

func (f *failSets) Set(key string, value []byte, cas uint32) error {
	if f.on {
		return errors.New("host: shared data unavailable")
	}
	return f.sharedData.Set(key, value, cas)
}

// TestLostDebitCounted: a cost known from the response whose debit cannot
// be written is counted (failed_open: the request went through without
// paying), not only logged.
func TestLostDebitCounted(t *testing.T) {
	sd := &failSets{}
	e := start(t, budget("response_header:x-usage", "", ""), func(_ *proxytest.EmulatorOption, vm *vmContext) { vm.sd = sd })
	id := e.host.InitializeHttpContext()
	e.host.CallOnRequestHeaders(id, requestHeaders([]string{"x-api-key", "a"}), false)
	sd.on = true
	e.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"x-usage", "50"}}, true)
	e.host.CompleteHttpContext(id)
	if n := e.counter("rule.tokens.failed_open"); n != 1 {
		t.Fatalf("failed_open %d after a lost debit, want 1", n)
	}
}

// TestLateAnswerAfterEnvoyAnswered: Envoy answers a request paused for the
// limit service itself (its stream timeout), then the service's refusal
// arrives: the local rule's token is not refunded a second time, and no
// reply is attempted.
func TestLateAnswerAfterEnvoyAnswered(t *testing.T) {
	cfg := `{"service": {"cluster": "limitd"}, "rules": [
	  {"name": "local", "charge_on": ["2xx"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
	  {"name": "fleet", "scope": "cluster", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 9}}]}`
	e := start(t, cfg)
	id := e.host.InitializeHttpContext()
	if a := e.host.CallOnRequestHeaders(id, requestHeaders(nil), false); a != types.ActionPause {
		t.Fatalf("action %v, want a pause for the callout", a)
	}
	// Envoy's own 504: charge_on refunds the local rule's reservation.
	e.host.CallOnResponseHeaders(id, [][2]string{{":status", "504"}}, true)
	e.answer(id, `{"allowed":false,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":900,"reset_ms":900}]}`)
	if e.host.GetSentLocalResponse(id) != nil {
		t.Fatal("a reply was sent for a request Envoy had answered")
	}
	e.host.CompleteHttpContext(id)
	if n := e.counter("refunds"); n != 0 {
		t.Fatalf("refunds %d: the late refusal refunded a token the response had settled", n)
	}
	// The local bucket holds exactly 3 again (the 504's reservation back).
	for i := range 4 {
		id := e.host.InitializeHttpContext()
		e.host.CallOnRequestHeaders(id, requestHeaders(nil), false)
		if rejected := e.host.GetSentLocalResponse(id) != nil; rejected != (i == 3) {
			t.Fatalf("request %d: rejected %v; the local bucket should hold 3", i, rejected)
		}
		e.host.CompleteHttpContext(id)
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
