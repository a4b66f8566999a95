package plugin

import (
	"strings"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
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
