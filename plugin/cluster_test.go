package plugin

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

const mixed = `{"service": {"cluster": "limit_service", "timeout_ms": 30, "token": "s3cret"},
 "rules": [
  {"name": "local", "limit_keys": ["header:k"], "algorithm": "token_bucket",
   "algorithm_config": {"tokens_per_second": 1, "burst": 3}},
  {"name": "fleet", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket",
   "algorithm_config": {"tokens_per_second": 5, "burst": 10}}]}`

// callout starts a request that must pause on a callout and returns the
// context and the callout.
func (e *emulator) callout(headers ...string) (uint32, bool) {
	e.t.Helper()
	id := e.host.InitializeHttpContext()
	action := e.host.CallOnRequestHeaders(id, requestHeaders(headers), false)
	return id, action == types.ActionPause
}

func TestClusterCallout(t *testing.T) {
	e := start(t, mixed)
	id, paused := e.callout("k", "a")
	if !paused {
		t.Fatal("a cluster rule did not pause the request")
	}
	calls := e.host.GetCalloutAttributesFromContext(id)
	if len(calls) != 1 {
		t.Fatalf("%d callouts, want 1", len(calls))
	}
	c := calls[0]
	hdr := map[string]string{}
	for _, h := range c.Headers {
		hdr[h[0]] = h[1]
	}
	if c.Upstream != "limit_service" || hdr[":method"] != "POST" || hdr[":path"] != "/v1/decide" ||
		hdr[":authority"] != "limit_service" || hdr["authorization"] != "Bearer s3cret" {
		t.Fatalf("callout %s %v", c.Upstream, hdr)
	}
	// one cluster rule: no hash tag
	if !strings.HasPrefix(string(c.Body), `{"buckets":[{"key":"fleet:`) || !strings.Contains(string(c.Body), `"tokens_per_second":5,"burst":10,"cost":1}]}`) {
		t.Fatalf("callout body %s", c.Body)
	}
	e.host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil,
		[]byte(`{"allowed":true,"buckets":[{"allowed":true,"remaining":9,"retry_after_ms":0,"reset_ms":200}]}`))
	if a := e.host.GetCurrentHttpStreamAction(id); a != types.ActionContinue {
		t.Fatalf("after an allowing answer the stream is %v, want continued", a)
	}
	e.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	got := map[string]string{}
	for _, h := range e.host.GetCurrentResponseHeaders(id) {
		got[h[0]] = h[1]
	}
	// local has 2 of 3 left (0.67), fleet 9 of 10: local is closest to its limit
	if got["ratelimit"] != `"local";r=2;t=1` {
		t.Fatalf("ratelimit header %q", got["ratelimit"])
	}
}

func TestClusterRejectRefundsLocal(t *testing.T) {
	e := start(t, mixed)
	id, _ := e.callout("k", "a")
	c := e.host.GetCalloutAttributesFromContext(id)[0]
	e.host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil,
		[]byte(`{"allowed":false,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":1500,"reset_ms":2000}]}`))
	lr := e.host.GetSentLocalResponse(id)
	if lr == nil || lr.StatusCode != 429 {
		t.Fatalf("local reply %+v, want 429", lr)
	}
	hdr := map[string]string{}
	for _, h := range lr.Headers {
		hdr[h[0]] = h[1]
	}
	if hdr["retry-after"] < "2" || hdr["retry-after"] > "3" || hdr["ratelimit"] != `"fleet";r=0;t=2` {
		t.Fatalf("rejection headers %v", hdr)
	}
	// The local bucket got its token back.
	e.localHolds("k", "a", 3)
}

func TestClusterFailureModes(t *testing.T) {
	bodies := map[string]struct {
		headers [][2]string
		body    string
	}{
		"timeout":   {nil, ""},
		"status":    {[][2]string{{":status", "503"}}, "oops"},
		"not json":  {[][2]string{{":status", "200"}}, "{nope"},
		"too short": {[][2]string{{":status", "200"}}, `{"allowed":true,"buckets":[]}`},
	}
	for _, mode := range []string{"allow", "deny"} {
		cfg := strings.Replace(mixed, `"timeout_ms": 30`, `"timeout_ms": 30, "failure_mode": "`+mode+`"`, 1)
		for name, b := range bodies {
			t.Run(mode+"/"+name, func(t *testing.T) { // one emulator at a time: proxytest holds a lock
				e := start(t, cfg)
				id, _ := e.callout("k", "a")
				c := e.host.GetCalloutAttributesFromContext(id)[0]
				e.host.CallOnHttpCallResponse(c.CalloutID, b.headers, nil, []byte(b.body))
				lr := e.host.GetSentLocalResponse(id)
				switch {
				case mode == "allow" && (lr != nil || e.host.GetCurrentHttpStreamAction(id) != types.ActionContinue):
					t.Errorf("%s, allow: request not resumed", name)
				case mode == "deny" && (lr == nil || lr.StatusCode != 429):
					t.Errorf("%s, deny: local reply %+v, want 429", name, lr)
				}
				if e.counter("service_errors") != 1 {
					t.Errorf("%s, %s: service_errors = %d, want 1", name, mode, e.counter("service_errors"))
				}
			})
		}
	}
}

// TestClusterKeyIndependentOfOtherRules: a bucket's call carries no hash
// tag, so its identity in the limit service is its key alone, the same with
// one cluster rule or two (a hash tag sent only with two or more moved every
// bucket when a second rule was added).
func TestClusterKeyIndependentOfOtherRules(t *testing.T) {
	two := strings.Replace(mixed, `{"name": "local", "limit_keys"`, `{"name": "local", "scope": "cluster", "limit_keys"`, 1)
	bodies := map[string]string{}
	for name, cfg := range map[string]string{"one": mixed, "two": two} {
		t.Run(name, func(t *testing.T) { // one emulator per test
			e := start(t, cfg)
			id, _ := e.callout("k", "a")
			bodies[name] = string(e.host.GetCalloutAttributesFromContext(id)[0].Body)
		})
	}
	if strings.Contains(bodies["two"], "hash_tag") || strings.Count(bodies["two"], `"key"`) != 2 {
		t.Fatalf("two cluster rules: body %s, want one call with both buckets and no hash tag", bodies["two"])
	}
	fleet := func(body string) string {
		i := strings.Index(body, `{"key":"fleet:`)
		if i < 0 {
			t.Fatalf("no fleet bucket in %s", body)
		}
		return body[i : i+strings.Index(body[i:], "}")]
	}
	if fleet(bodies["one"]) != fleet(bodies["two"]) || strings.Contains(bodies["one"], "hash_tag") {
		t.Fatalf("the fleet bucket differs with a second rule:\n%s\n%s", bodies["one"], bodies["two"])
	}
}

// TestClusterKeyedHash: with service.key_secret, a bucket's key is an HMAC
// of its values under the secret: not the unkeyed hash anyone can compute,
// different under another secret, the same for the same value.
func TestClusterKeyedHash(t *testing.T) {
	key := func(cfg string, value string) (key string) {
		t.Run(value, func(t *testing.T) { // one emulator per test
			e := start(t, cfg)
			id, _ := e.callout("k", value)
			body := string(e.host.GetCalloutAttributesFromContext(id)[0].Body)
			i := strings.Index(body, `"key":"fleet:`)
			if i < 0 {
				t.Fatalf("no fleet bucket in %s", body)
			}
			key = body[i+7 : i+7+strings.Index(body[i+7:], `"`)]
		})
		return key
	}
	keyed := strings.Replace(mixed, `"token": "s3cret"`, `"token": "s3cret", "key_secret": "0123456789abcdef-one"`, 1)
	other := strings.Replace(mixed, `"token": "s3cret"`, `"token": "s3cret", "key_secret": "0123456789abcdef-two"`, 1)
	plain, k1, k1again, k2 := key(mixed, "a"), key(keyed, "a"), key(keyed, "a"), key(other, "a")
	if k1 == plain || k1 == k2 || k1 != k1again || key(keyed, "b") == k1 {
		t.Fatalf("keys: unkeyed %s, keyed %s (again %s), other secret %s", plain, k1, k1again, k2)
	}
	if len(k1) != len("fleet:")+32 {
		t.Fatalf("keyed key %s: want the rule name and 32 hex digits", k1)
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
				case mode == "deny" && (lr == nil || lr.StatusCode != 429 || !strings.Contains(string(lr.Data), "limit_service_unavailable")):
					t.Fatalf("deny: reply %+v, want 429 %s", lr, "limit_service_unavailable")
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
