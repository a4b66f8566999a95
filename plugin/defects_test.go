package plugin

// Tests for the defects of issue 10 found in the request path at 5c30b47,
// each named after what it reproduces. Those that need the host to misbehave
// in ways proxytest cannot (a failing local reply, an answer after the stream
// ended, a deep token in a real VM) are in wasm_defects_test.go.

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/internal/slots"
)

// TestTierMembers pins which member of a tier counts, for every kind of
// member (defect 1: a member that matched but lacked its key exempted the
// request from the whole tier). The tier is "plan"; "fallback" limits every
// request by header k with burst 2.
func TestTierMembers(t *testing.T) {
	fallback := limitRule("fallback", `, "group": "plan", "limit_keys": ["header:k"]`, "0.001", "2")
	cases := []struct {
		name   string
		member string // the first member of the tier
		hs     []string
		want   []int // statuses of four requests
	}{
		{"matches, key present: it counts", limitRule("gold", `, "group": "plan", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "3"),
			[]string{"x-plan", "gold", "sub", "a", "k", "1"}, []int{200, 200, 200, 429}},
		{"matches, key missing, skip: the next member counts", limitRule("gold", `, "group": "plan", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "3"),
			[]string{"x-plan", "gold", "k", "1"}, []int{200, 200, 429, 429}},
		{"matches, key missing, shared: its shared bucket counts", limitRule("gold", `, "group": "plan", "missing_key": "shared", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "3"),
			[]string{"x-plan", "gold", "k", "1"}, []int{200, 200, 200, 429}},
		{"matches, key missing, deny: it rejects", limitRule("gold", `, "group": "plan", "missing_key": "deny", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "3"),
			[]string{"x-plan", "gold", "k", "1"}, []int{400, 400, 400, 400}},
		{"does not match: the next member counts", limitRule("gold", `, "group": "plan", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "3"),
			[]string{"x-plan", "silver", "sub", "a", "k", "1"}, []int{200, 200, 429, 429}},
		{"an allow member that matches: exempt", `{"name": "staff", "action": "allow", "group": "plan", "match": {"header:x-plan": {"equals": "staff"}}}`,
			[]string{"x-plan", "staff", "k", "1"}, []int{200, 200, 200, 200}},
		{"a shadow member applies: the tier is its, never rejecting", limitRule("gold", `, "mode": "shadow", "group": "plan", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "1"),
			[]string{"x-plan", "gold", "sub", "a", "k", "1"}, []int{200, 200, 200, 200}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := start(t, rules(``, c.member, fallback))
			got := e.statuses(4, c.hs...)
			for i := range c.want {
				if got[i] != c.want[i] {
					t.Fatalf("statuses %v, want %v", got, c.want)
				}
			}
		})
	}
}

// TestTiersByPlanExample is the attack on examples/tiers-by-plan: an
// enterprise token without the key the enterprise member needs must not pass
// unlimited.
func TestTiersByPlanExample(t *testing.T) {
	e := start(t, rules(``,
		limitRule("enterprise", `, "group": "plan", "match": {"header:x-plan": {"equals": "enterprise"}}, "limit_keys": ["header:sub"]`, "0.001", "100"),
		limitRule("free", `, "group": "plan", "limit_keys": ["ip:address"]`, "0.001", "5")))
	if got := count(e.statuses(20, "x-plan", "enterprise"), 200); got != 5 {
		t.Fatalf("enterprise plan without sub: %d of 20 admitted, want the free tier's 5", got)
	}
}

// failOnce fails the first Set after arm with a host error (not a CAS
// mismatch): the local stack then fails open with nothing consumed.
type failOnce struct {
	sharedData
	armed bool
}

func (f *failOnce) Set(key string, value []byte, cas uint32) error {
	if f.armed {
		f.armed = false
		return errors.New("host: shared data unavailable")
	}
	return f.sharedData.Set(key, value, cas)
}

// TestNoRefundOfWhatWasNotTaken (defect 2): the local stack fails open,
// then the limit service rejects; the local bucket must not gain a token.
func TestNoRefundOfWhatWasNotTaken(t *testing.T) {
	sd := &failOnce{}
	e := start(t, mixed, func(_ *proxytest.EmulatorOption, vm *vmContext) { vm.sd = sd })
	id, _ := e.callout("k", "a") // takes 1 of local's 3
	e.answer(id, `{"allowed":true,"buckets":[{"allowed":true,"remaining":9,"retry_after_ms":0,"reset_ms":200}]}`)
	e.host.CompleteHttpContext(id)
	sd.armed = true
	id, _ = e.callout("k", "a") // local fails open: nothing taken
	e.answer(id, `{"allowed":false,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":900,"reset_ms":900}]}`)
	if e.counter("rule.local.failed_open") != 1 || e.counter("refunds") != 0 {
		t.Fatalf("failed_open %d, refunds %d; want 1 and 0", e.counter("rule.local.failed_open"), e.counter("refunds"))
	}
	e.host.CompleteHttpContext(id)
	e.localHolds("k", "a", 2)
}

// localHolds checks that the local rule of mixed holds exactly n tokens for
// the key: n requests pass it (and wait on the callout), the next is
// rejected locally.
func (e *emulator) localHolds(k, v string, n int) {
	e.t.Helper()
	for i := 0; i <= n; i++ {
		id, _ := e.callout(k, v)
		if rejected := e.host.GetSentLocalResponse(id) != nil; rejected != (i == n) {
			e.t.Fatalf("request %d: rejected %v; the local bucket should hold %d", i, rejected, n)
		}
		e.host.CompleteHttpContext(id)
	}
}

// answer delivers the limit service's 200 answer to the callout of id.
func (e *emulator) answer(id uint32, body string) {
	e.t.Helper()
	calls := e.host.GetCalloutAttributesFromContext(id)
	if len(calls) == 0 {
		e.t.Fatal("no callout to answer")
	}
	e.host.CallOnHttpCallResponse(calls[len(calls)-1].CalloutID, [][2]string{{":status", "200"}}, nil, []byte(body))
}

// TestMalformedVerdict (defect 4): "allowed": false with no refusing bucket,
// or true with one, is malformed and follows failure_mode; with "deny" the
// local tokens are given back once, with "allow" not at all.
func TestMalformedVerdict(t *testing.T) {
	for _, mode := range []string{"allow", "deny"} {
		for _, body := range []string{
			`{"allowed":false,"buckets":[{"allowed":true,"remaining":9,"retry_after_ms":0,"reset_ms":200}]}`,
			`{"allowed":true,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":900,"reset_ms":900}]}`,
		} {
			t.Run(mode+"/"+body[:16], func(t *testing.T) {
				cfg := strings.Replace(mixed, `"timeout_ms": 30`, `"timeout_ms": 30, "failure_mode": "`+mode+`"`, 1)
				e := start(t, cfg)
				id, _ := e.callout("k", "a")
				e.answer(id, body)
				lr := e.host.GetSentLocalResponse(id)
				switch {
				case mode == "allow" && (lr != nil || e.host.GetCurrentHttpStreamAction(id) != types.ActionContinue):
					t.Fatalf("allow: not resumed (reply %+v)", lr)
				case mode == "deny" && (lr == nil || lr.StatusCode != 429 || !strings.Contains(string(lr.Data), reasonServiceDown)):
					t.Fatalf("deny: reply %+v, want 429 %s", lr, reasonServiceDown)
				}
				if e.counter("service_errors") != 1 {
					t.Fatalf("service_errors = %d, want 1", e.counter("service_errors"))
				}
				wantRefunds := map[string]uint64{"allow": 0, "deny": 1}[mode]
				if got := e.counter("refunds"); got != wantRefunds {
					t.Fatalf("refunds = %d, want %d", got, wantRefunds)
				}
				e.host.CompleteHttpContext(id)
				// local (burst 3) lost exactly what the outcome says.
				e.localHolds("k", "a", map[string]int{"allow": 2, "deny": 3}[mode])
			})
		}
	}
}

// TestShadowClusterRule (defect 5): a shadow cluster rule is decided by the
// limit service, rides in the callout of the enforced cluster rules, and
// never rejects; alone it is sent without pausing the request.
func TestShadowClusterRule(t *testing.T) {
	t.Run("alone: not paused, counted when the answer comes", func(t *testing.T) {
		e := start(t, `{"service": {"cluster": "limit_service"}, "rules": [{"name": "trial", "mode": "shadow", "scope": "cluster",
		  "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`)
		id, paused := e.callout("k", "a")
		if paused {
			t.Fatal("a shadow-only cluster rule paused the request")
		}
		if len(e.host.GetCalloutAttributesFromContext(id)) != 0 {
			t.Fatal("the request owns the shadow call: its answer would be lost once the request ends")
		}
		calls := e.host.GetCalloutAttributesFromContext(proxytest.PluginContextID)
		if len(calls) != 1 || !strings.Contains(string(calls[0].Body), `"shadow":true`) {
			t.Fatalf("plugin context's callouts %+v, want one with a shadow bucket", calls)
		}
		e.host.CompleteHttpContext(id) // the request ends before the answer
		e.host.CallOnHttpCallResponse(calls[0].CalloutID, [][2]string{{":status", "200"}}, nil,
			[]byte(`{"allowed":true,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":500,"reset_ms":2000}]}`))
		if e.counter("rule.trial.shadow_rejected") != 1 {
			t.Fatalf("shadow_rejected = %d, want 1", e.counter("rule.trial.shadow_rejected"))
		}
		if e.host.GetSentLocalResponse(id) != nil {
			t.Fatal("a shadow rule rejected")
		}
	})
	t.Run("beside an enforced rule: one callout, only the enforced bucket decides", func(t *testing.T) {
		e := start(t, `{"service": {"cluster": "limit_service"}, "rules": [
		  {"name": "trial", "mode": "shadow", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 2}},
		  {"name": "fleet", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 9}}]}`)
		id, paused := e.callout("k", "a")
		calls := e.host.GetCalloutAttributesFromContext(id)
		if !paused || len(calls) != 1 {
			t.Fatalf("paused %v, %d callouts; want paused on one", paused, len(calls))
		}
		body := string(calls[0].Body)
		if !strings.HasPrefix(body, `{"buckets":[{"key":"fleet:`) || !strings.Contains(body, `{"key":"trial:`) ||
			strings.Count(body, `"shadow":true`) != 1 {
			t.Fatalf("body %s: want the enforced bucket first, the shadow one after, flagged", body)
		}
		e.answer(id, `{"allowed":true,"buckets":[{"allowed":true,"remaining":8,"retry_after_ms":0,"reset_ms":1000},{"allowed":false,"remaining":0,"retry_after_ms":500,"reset_ms":2000}]}`)
		if a := e.host.GetCurrentHttpStreamAction(id); a != types.ActionContinue || e.host.GetSentLocalResponse(id) != nil {
			t.Fatalf("the shadow bucket's refusal held or rejected the request: %v", a)
		}
		if e.counter("rule.trial.shadow_rejected") != 1 || e.counter("rule.fleet.allowed") != 1 {
			t.Fatalf("shadow_rejected %d, fleet allowed %d; want 1, 1", e.counter("rule.trial.shadow_rejected"), e.counter("rule.fleet.allowed"))
		}
	})
}

// TestDeepUnverifiedToken (defect 6): a bearer token whose payload is JSON
// nested 10,000 deep is no key (the rule is skipped), and the next request
// is decided as usual. In a Wasm VM the recursive validator ran out of stack
// on it; see also TestWasmDeepToken.
func TestDeepUnverifiedToken(t *testing.T) {
	e := start(t, rules(`"trust_unverified_jwt": true, `, limitRule("r", `, "limit_keys": ["jwt:sub"]`, "0.001", "1")))
	deep := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	tok := "Bearer e30." + base64.RawURLEncoding.EncodeToString([]byte(deep)) + ".x"
	if st := e.statuses(3, "authorization", tok); count(st, 200) != 3 {
		t.Fatalf("deep token: %v, want the rule skipped", st)
	}
	big := "Bearer e30." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"`+strings.Repeat("x", maxJWTPayload)+`"}`)) + ".x"
	if v, ok := unverifiedClaim(big, "sub"); ok {
		t.Fatalf("a payload over %d bytes was read: %q", maxJWTPayload, v[:10])
	}
	ok := "Bearer e30." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"alice"}`)) + ".x"
	if st := e.statuses(2, "authorization", ok); st[0] != 200 || st[1] != 429 {
		t.Fatalf("a normal token after the deep one: %v", st)
	}
}

// TestRegexReadsBoundedInput (defect 7): a regex condition reads at most
// RegexMaxInput bytes; a longer value does not match and is counted.
func TestRegexReadsBoundedInput(t *testing.T) {
	e := start(t, rules(``, limitRule("hex", `, "match": {"header:x-id": {"regex": "[0-9a-f]{64}"}}`, "0.001", "1")))
	id := strings.Repeat("a", 64)
	if st := e.statuses(2, "x-id", id); st[1] != 429 {
		t.Fatalf("a matching value: %v, want the rule to apply", st)
	}
	attack := strings.Repeat(strings.Repeat("a", 63)+"!", 1000) // 64 000 bytes
	if st := e.statuses(3, "x-id", attack); count(st, 200) != 3 {
		t.Fatalf("a 64 KB value: %v, want no match", st)
	}
	if got := e.counter("regex_value_too_long"); got != 3 {
		t.Fatalf("regex_value_too_long = %d, want 3", got)
	}
}

// TestCookieAsUpstreamsReadIt (defect 8): the cookie of every Cookie header,
// names trimmed, is the cookie the upstream sees.
func TestCookieAsUpstreamsReadIt(t *testing.T) {
	e := start(t, rules(``, limitRule("session", `, "limit_keys": ["cookie:sid"]`, "0.001", "2")))
	e.statuses(2, "cookie", "sid=victim") // exhausted
	for name, hs := range map[string][][2]string{
		"space before =":       {{"cookie", "sid =victim"}},
		"tab and quotes":       {{"cookie", "a=1;\tsid\t=\"victim\""}},
		"second Cookie header": {{"cookie", "theme=dark"}, {"cookie", "sid=victim"}},
	} {
		id := e.host.InitializeHttpContext()
		base := [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "example"}}
		e.host.CallOnRequestHeaders(id, append(base, hs...), false)
		lr := e.host.GetSentLocalResponse(id)
		if lr == nil || lr.StatusCode != 429 {
			t.Errorf("%s: not limited as sid=victim (reply %+v)", name, lr)
		}
		e.host.CompleteHttpContext(id)
	}
}

// TestServiceFailuresLogOnceASecond (defect 10): a limit-service outage
// logs one warning a second, however many requests fail.
func TestServiceFailuresLogOnceASecond(t *testing.T) {
	e := start(t, mixed)
	for i := 0; i < 300; i++ {
		id, _ := e.callout("k", strconv.Itoa(i))
		calls := e.host.GetCalloutAttributesFromContext(id)
		e.host.CallOnHttpCallResponse(calls[0].CalloutID, nil, nil, nil) // failed call
		e.host.CompleteHttpContext(id)
	}
	e.clk.t += sec
	id, _ := e.callout("k", "last")
	e.host.CallOnHttpCallResponse(e.host.GetCalloutAttributesFromContext(id)[0].CalloutID, nil, nil, nil)
	warns := e.host.GetWarnLogs()
	if e.counter("service_errors") != 301 || len(warns) != 2 || !strings.Contains(warns[1], "(299 similar lines suppressed)") {
		t.Fatalf("service_errors %d, warnings %q: want 301 errors and 2 lines, the second counting 299 suppressed",
			e.counter("service_errors"), warns)
	}
}

// TestTinyCostIsNoCost (defect 11): a cost below config.MinCost, 1e-300 as
// much as 0, is not a cost: default_cost is charged.
func TestTinyCostIsNoCost(t *testing.T) {
	e := start(t, perKey) // burst 4, default_cost 1
	for _, v := range []string{"1e-300", "0", "-0", "0.0009", "5e-324"} {
		e.clk.t += 10 * sec
		if r := e.do("x-api-key", "a", "x-cost", v); r.headers["ratelimit-remaining"] != "3" {
			t.Errorf("cost %s: remaining %q, want 3 (default cost)", v, r.headers["ratelimit-remaining"])
		}
	}
	e.clk.t += 10 * sec
	if r := e.do("x-api-key", "a", "x-cost", "0.001"); r.headers["ratelimit-remaining"] != "3" {
		t.Errorf("cost 0.001 (the minimum): remaining %q, want 3 (floor of 3.999)", r.headers["ratelimit-remaining"])
	}
}

var _ slots.SharedData = &failOnce{}
