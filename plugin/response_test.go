package plugin

import (
	"errors"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// upstream is what the upstream answers: a status, headers and the body in
// chunks (none: a response without a body).
type upstream struct {
	status  string
	headers [][2]string
	chunks  []string
}

// doUpstream runs one request through the plugin and, when it continues,
// the upstream's response, checking that no chunk of the body is held.
func (e *emulator) doUpstream(up upstream, headers ...string) response {
	e.t.Helper()
	id := e.host.InitializeHttpContext()
	e.host.CallOnRequestHeaders(id, requestHeaders(headers), false)
	if lr := e.host.GetSentLocalResponse(id); lr != nil {
		r := response{status: int(lr.StatusCode), body: string(lr.Data), headers: map[string]string{}}
		for _, h := range lr.Headers {
			r.headers[h[0]] = h[1]
		}
		e.host.CallOnResponseHeaders(id, lr.Headers, false)
		e.host.CompleteHttpContext(id)
		return r
	}
	hs := append([][2]string{{":status", up.status}}, up.headers...)
	e.host.CallOnResponseHeaders(id, hs, len(up.chunks) == 0)
	r := response{status: 200, headers: map[string]string{}}
	for _, h := range e.host.GetCurrentResponseHeaders(id) {
		r.headers[h[0]] = h[1]
	}
	for i, ch := range up.chunks {
		if a := e.host.CallOnResponseBody(id, []byte(ch), i == len(up.chunks)-1); a != types.ActionContinue {
			e.t.Fatalf("body chunk %d: action %v, want continue", i, a)
		}
	}
	e.host.CompleteHttpContext(id)
	return r
}

// budget is a rule of 100 tokens refilled at 1 per second per x-api-key,
// whose cost comes from cost (a cost_source) with extra algorithm_config
// fields, and extra rule fields.
func budget(cost, algExtra, ruleExtra string) string {
	if algExtra != "" {
		algExtra = "," + algExtra
	}
	if ruleExtra != "" {
		ruleExtra = "," + ruleExtra
	}
	return `{"rules": [{"name": "tokens", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 1, "burst": 100, "cost_source": "` + cost + `"` + algExtra + `}` + ruleExtra + `}]}`
}

// admitted counts the requests admitted before the first 429.
func admittedBefore429(e *emulator, up upstream, max int) int {
	for i := 0; i < max; i++ {
		if r := e.doUpstream(up, "x-api-key", "k"); r.status == 429 {
			return i
		}
	}
	return max
}

func TestResponseCostFourBeforeRejection(t *testing.T) {
	// A budget of 100, requests costing 30 (reserving the default 1):
	// exactly 4 are admitted, the 4th taking the bucket to −20.
	usage := `{"id":"x","usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}`
	for _, tc := range []struct {
		name string
		cfg  string
		up   upstream
	}{
		{"header", budget("response_header:x-usage", "", ""), upstream{status: "200", headers: [][2]string{{"x-usage", "30"}}}},
		{"json", budget("response_json:usage.total_tokens", "", ""), upstream{status: "200", headers: [][2]string{{"content-type", "application/json"}}, chunks: []string{usage[:20], usage[20:]}}},
		{"sse", budget("response_json:usage.total_tokens", "", ""), upstream{status: "200", headers: [][2]string{{"content-type", "text/event-stream; charset=utf-8"}}, chunks: []string{
			"data: {\"usage\":{\"total_tokens\":3}}\n\n",
			"data: {\"choices\":[]}\r\n\r\ndata: {\"usage\":{\"tot",
			"al_tokens\":30}}\n\n",
			"data: [DONE]\n\n",
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, tc.cfg)
			if got := admittedBefore429(e, tc.up, 10); got != 4 {
				t.Fatalf("admitted %d before the first 429, want 4", got)
			}
			r := e.doUpstream(tc.up, "x-api-key", "k")
			// 21 tokens short at 1 per second: Retry-After 21 plus jitter.
			if r.status != 429 || r.headers["ratelimit"] != `"tokens";r=0;t=21` {
				t.Fatalf("after the debt: %d %v", r.status, r.headers)
			}
			if got := e.counter("rule.tokens.cost_missing"); got != 0 {
				t.Errorf("cost_missing = %d", got)
			}
			e.clk.t += 21 * sec
			if r := e.doUpstream(tc.up, "x-api-key", "k"); r.status != 200 {
				t.Fatalf("after the debt was paid: %d", r.status)
			}
		})
	}
}

func TestResponseHeaderCostHeaders(t *testing.T) {
	// With response_header the RateLimit headers show the bucket after the
	// charge; with response_json, after the reservation.
	e := start(t, budget("response_header:x-usage", `"default_cost": 10`, ""))
	r := e.doUpstream(upstream{status: "200", headers: [][2]string{{"x-usage", "25.5"}}}, "x-api-key", "k")
	if r.headers["ratelimit-remaining"] != "74" {
		t.Errorf("remaining after a charge of 25.5 = %q, want 74", r.headers["ratelimit-remaining"])
	}
	r = e.doUpstream(upstream{status: "200", headers: [][2]string{{"x-usage", "0"}}}, "x-api-key", "k")
	if r.headers["ratelimit-remaining"] != "74" {
		t.Errorf("remaining after a cost of 0 = %q, want 74 (the reservation refunded)", r.headers["ratelimit-remaining"])
	}
}

func TestResponseJSONCostHeaders(t *testing.T) {
	e := start(t, budget("response_json:n", `"default_cost": 10`, ""))
	r := e.doUpstream(upstream{status: "200", chunks: []string{`{"n":50}`}}, "x-api-key", "k")
	if r.headers["ratelimit-remaining"] != "90" {
		t.Errorf("remaining with response_json = %q, want 90 (after the reservation)", r.headers["ratelimit-remaining"])
	}
	r = e.doUpstream(upstream{status: "200", chunks: []string{`{"n":1}`}}, "x-api-key", "k")
	if r.headers["ratelimit-remaining"] != "40" {
		t.Errorf("remaining = %q, want 40 (100 − 50 − 10 reserved)", r.headers["ratelimit-remaining"])
	}
}

func TestResponseCostMissing(t *testing.T) {
	// A missing or malformed value keeps the reservation (default_cost 10)
	// and counts in cost_missing.
	for _, tc := range []struct {
		name string
		cfg  string
		up   upstream
	}{
		{"header absent", budget("response_header:x-usage", `"default_cost": 10`, ""), upstream{status: "200"}},
		{"header not a number", budget("response_header:x-usage", `"default_cost": 10`, ""), upstream{status: "200", headers: [][2]string{{"x-usage", "lots"}}}},
		{"header negative", budget("response_header:x-usage", `"default_cost": 10`, ""), upstream{status: "200", headers: [][2]string{{"x-usage", "-3"}}}},
		{"header infinite", budget("response_header:x-usage", `"default_cost": 10`, ""), upstream{status: "200", headers: [][2]string{{"x-usage", "Inf"}}}},
		{"no body", budget("response_json:n", `"default_cost": 10`, ""), upstream{status: "200"}},
		{"not JSON", budget("response_json:n", `"default_cost": 10`, ""), upstream{status: "200", chunks: []string{`<html>`}}},
		{"truncated JSON", budget("response_json:n", `"default_cost": 10`, ""), upstream{status: "200", chunks: []string{`{"n":50`}}},
		{"path absent", budget("response_json:n", `"default_cost": 10`, ""), upstream{status: "200", chunks: []string{`{"m":50}`}}},
		{"value a string", budget("response_json:n", `"default_cost": 10`, ""), upstream{status: "200", chunks: []string{`{"n":"many"}`}}},
		{"body past max_body_bytes", budget("response_json:n", `"default_cost": 10, "max_body_bytes": 16`, ""), upstream{status: "200", chunks: []string{`{"n":50,`, `"pad":"xxxxxxxxx"}`}}},
		{"not JSON after the value", budget("response_json:n", `"default_cost": 10`, ""), upstream{status: "200", chunks: []string{`{"n":50,"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 99) + `}`}}},
		{"stream without the path", budget("response_json:n", `"default_cost": 10`, ""), upstream{status: "200", headers: [][2]string{{"content-type", "text/event-stream"}}, chunks: []string{"data: {\"m\":1}\n\n"}}},
		{"stream whose last carrier is malformed", budget("response_json:n", `"default_cost": 10`, ""), upstream{status: "200", headers: [][2]string{{"content-type", "text/event-stream"}}, chunks: []string{"data: {\"n\":1}\n\ndata: {\"n\":null}\n\n"}}},
		{"stream event past max_body_bytes", budget("response_json:n", `"default_cost": 10, "max_body_bytes": 10`, ""), upstream{status: "200", headers: [][2]string{{"content-type", "text/event-stream"}}, chunks: []string{"data: {\"n\":5,\"p\":1}\n\n"}}},
		{"stream event never ended", budget("response_json:n", `"default_cost": 10`, ""), upstream{status: "200", headers: [][2]string{{"content-type", "text/event-stream"}}, chunks: []string{"data: {\"n\":5}\n"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, tc.cfg)
			r := e.doUpstream(tc.up, "x-api-key", "k")
			if r.status != 200 {
				t.Fatalf("status %d", r.status)
			}
			if got := e.counter("rule.tokens.cost_missing"); got != 1 {
				t.Errorf("cost_missing = %d, want 1", got)
			}
			r = e.doUpstream(upstream{status: "200", headers: [][2]string{{"x-usage", "0"}}, chunks: []string{`{"n":0}`}}, "x-api-key", "k")
			if got := r.headers["ratelimit-remaining"]; got != "80" && got != "90" {
				t.Errorf("remaining = %q, want the first reservation kept (80 or 90)", got)
			}
		})
	}
}

func TestChargeOn(t *testing.T) {
	// charge_on ["401"]: any number of 200s pass, 401s are charged: a burst
	// of 5 gives 5 401s, then 429.
	e := start(t, `{"rules": [{"name": "logins", "limit_keys": ["header:x-user"], "charge_on": ["401"],
	  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 5}}]}`)
	for i := 0; i < 20; i++ {
		if r := e.doUpstream(upstream{status: "200"}, "x-user", "u"); r.status != 200 || r.headers["ratelimit-remaining"] != "5" {
			t.Fatalf("200 number %d: %d, remaining %q", i, r.status, r.headers["ratelimit-remaining"])
		}
	}
	for i := 0; i < 5; i++ {
		if r := e.doUpstream(upstream{status: "401"}, "x-user", "u"); r.status != 200 {
			t.Fatalf("401 number %d rejected", i)
		}
	}
	if r := e.doUpstream(upstream{status: "200"}, "x-user", "u"); r.status != 429 {
		t.Fatalf("after 5 401s: %d, want 429", r.status)
	}
	if _, err := e.host.GetCounterMetric("tokenbucket.rule.logins.cost_missing"); err == nil {
		t.Error("cost_missing defined for a rule whose cost is not from the response")
	}
}

func TestChargeOnClassesAndStacked(t *testing.T) {
	// Two stacked rules: "ok" charges 2xx only, "all" every response; a
	// 500 refunds "ok" and keeps "all".
	e := start(t, `{"rules": [
	  {"name": "ok", "charge_on": ["2xx"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 10}},
	  {"name": "all", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 10,
	    "cost_source": "response_header:x-cost", "default_cost": 2}}]}`)
	r := e.doUpstream(upstream{status: "500", headers: [][2]string{{"x-cost", "3"}}})
	// "ok" back at 10, "all" at 7: the headers show "all".
	if r.headers["ratelimit"] != `"all";r=7;t=300` {
		t.Fatalf("after a 500: %v", r.headers)
	}
	r = e.doUpstream(upstream{status: "204", headers: [][2]string{{"x-cost", "1"}}})
	// "ok" 9, "all" 6.
	if r.headers["ratelimit"] != `"all";r=6;t=400` {
		t.Fatalf("after a 204: %v", r.headers)
	}
}

func TestShadowResponseCost(t *testing.T) {
	// A shadow rule is charged like an enforced one and never rejects: its
	// debt shows in shadow_rejected.
	e := start(t, `{"rules": [{"name": "s", "mode": "shadow", "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 0.01, "burst": 10, "cost_source": "response_header:x-cost"}}]}`)
	up := upstream{status: "200", headers: [][2]string{{"x-cost", "8"}}}
	for i := 0; i < 3; i++ {
		if r := e.doUpstream(up); r.status != 200 || r.headers["ratelimit"] != "" {
			t.Fatalf("request %d: %d %v", i, r.status, r.headers)
		}
	}
	if a, s := e.counter("rule.s.allowed"), e.counter("rule.s.shadow_rejected"); a != 2 || s != 1 {
		t.Fatalf("allowed %d, shadow_rejected %d; want 2 and 1", a, s)
	}
}

func TestNoBodyCallbackWorkWithoutResponseJSON(t *testing.T) {
	// Without a response_json rule the body callback reads nothing.
	e := start(t, perKey)
	id := e.host.InitializeHttpContext()
	e.host.CallOnRequestHeaders(id, requestHeaders([]string{"x-api-key", "a"}), false)
	e.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	c := e.host.GetCurrentHttpStreamAction(id)
	_ = c
	if a := e.host.CallOnResponseBody(id, []byte(`{"n":1}`), true); a != types.ActionContinue {
		t.Fatalf("action %v", a)
	}
	e.host.CompleteHttpContext(id)
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
