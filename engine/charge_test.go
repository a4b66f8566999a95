package engine_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// budget is a rule of 100 tokens refilled at 1 per second per x-api-key,
// whose cost comes from cost (a cost_source) with extra algorithm_config
// fields.
func budget(cost, algExtra string) string {
	if algExtra != "" {
		algExtra = "," + algExtra
	}
	return `{"rules": [{"name": "tokens", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 1, "burst": 100, "cost_source": "` + cost + `"` + algExtra + `}}]}`
}

var (
	jsonType = [][2]string{{"content-type", "application/json"}}
	sseType  = [][2]string{{"content-type", "text/event-stream"}}
	key      = []string{"x-api-key", "k"}
)

// remaining is a request of key k answered by up, whose client sees the
// bucket hold r whole tokens.
func remaining(up upstream, r string) exchange {
	return exchange{req: key, up: up, status: 200, headers: map[string]string{"ratelimit-remaining": r}}
}

// TestResponseCostFourBeforeRejection: a budget of 100, requests costing 30
// by their response (reserving the default 1): exactly 4 are admitted, the
// 4th taking the bucket to −20; the next waits 21 s, then passes.
func TestResponseCostFourBeforeRejection(t *testing.T) {
	usage := `{"id":"x","usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}`
	four := func(name, cfg string, up upstream) timeline {
		return timeline{name: name, cfg: cfg, steps: []exchange{
			{times: 4, req: key, up: up, status: 200},
			// 21 tokens short at 1 per second: Retry-After 21 plus jitter.
			{req: key, up: up, status: 429, headers: map[string]string{"ratelimit": `"tokens";r=0;t=21`}},
			{wait: 21 * sec, req: key, up: up, status: 200},
		}, metrics: map[string]int64{"rule.tokens.cost_missing": 0}}
	}
	run(t, []timeline{
		four("header", budget("response_header:x-usage", ""), upstream{headers: [][2]string{{"x-usage", "30"}}}),
		four("json", budget("response_json:usage.total_tokens", ""), upstream{headers: jsonType, chunks: []string{usage[:20], usage[20:]}}),
		four("sse", budget("response_json:usage.total_tokens", ""), upstream{headers: [][2]string{{"content-type", "text/event-stream; charset=utf-8"}}, chunks: []string{
			"data: {\"usage\":{\"total_tokens\":3}}\n\n",
			"data: {\"choices\":[]}\r\n\r\ndata: {\"usage\":{\"tot",
			"al_tokens\":30}}\n\n",
			"data: [DONE]\n\n",
		}}),
	})
}

// TestResponseCostHeaders: with response_header the RateLimit headers show
// the bucket after the charge; with response_json, after the reservation
// (the body comes after the headers); a charge equal to the reservation
// charges nothing and shows the bucket as it is, not full.
func TestResponseCostHeaders(t *testing.T) {
	usage := func(v string) upstream { return upstream{headers: [][2]string{{"x-usage", v}}} }
	body := func(b string) upstream { return upstream{chunks: []string{b}} }
	run(t, []timeline{
		{name: "response_header: after the charge", cfg: budget("response_header:x-usage", `"default_cost": 10`), steps: []exchange{
			remaining(usage("25.5"), "74"),
			remaining(usage("0"), "74"), // the reservation refunded
		}},
		{name: "response_json: after the reservation", cfg: budget("response_json:n", `"default_cost": 10`), steps: []exchange{
			remaining(body(`{"n":50}`), "90"),
			remaining(body(`{"n":1}`), "40"), // 100 − 50 − 10 reserved
		}},
		{name: "a charge equal to the reservation", cfg: budget("response_header:x-usage", `"default_cost": 10`), steps: []exchange{
			remaining(usage("10"), "90"), remaining(usage("10"), "80"), remaining(usage("10"), "70"),
		}},
	})
}

// TestResponseCostMissing: a missing or malformed value keeps the
// reservation (default_cost 10) and counts in cost_missing.
func TestResponseCostMissing(t *testing.T) {
	header, json := budget("response_header:x-usage", `"default_cost": 10`), budget("response_json:n", `"default_cost": 10`)
	usage := func(v string) upstream { return upstream{headers: [][2]string{{"x-usage", v}}} }
	body := func(chunks ...string) upstream { return upstream{chunks: chunks} }
	events := func(chunks ...string) upstream { return upstream{headers: sseType, chunks: chunks} }
	var table []timeline
	for _, c := range []struct {
		name, cfg string
		up        upstream
	}{
		{"header absent", header, upstream{}},
		{"header not a number", header, usage("lots")},
		{"header negative", header, usage("-3")},
		{"header infinite", header, usage("Inf")},
		{"header below MinCost", header, usage("1e-300")},
		{"no body", json, upstream{}},
		{"not JSON", json, body(`<html>`)},
		{"truncated JSON", json, body(`{"n":50`)},
		{"path absent", json, body(`{"m":50}`)},
		{"value a string", json, body(`{"n":"many"}`)},
		{"body past max_body_bytes", budget("response_json:n", `"default_cost": 10, "max_body_bytes": 16`), body(`{"n":50,`, `"pad":"xxxxxxxxx"}`)},
		{"not JSON after the value", json, body(`{"n":50,"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 99) + `}`)},
		{"stream without the path", json, events("data: {\"m\":1}\n\n")},
		{"stream whose last carrier is malformed", json, events("data: {\"n\":1}\n\ndata: {\"n\":null}\n\n")},
		{"stream event past max_body_bytes", budget("response_json:n", `"default_cost": 10, "max_body_bytes": 10`), events("data: {\"n\":5,\"p\":1}\n\n")},
		{"stream event never ended", json, events("data: {\"n\":5}\n")},
	} {
		// A second request of cost 0: what is left is the first
		// reservation (shown after the charge with response_header, after
		// the second reservation with response_json).
		kept := "80"
		if strings.Contains(c.cfg, "response_header") {
			kept = "90"
		}
		table = append(table, timeline{name: c.name, cfg: c.cfg, steps: []exchange{
			{req: key, up: c.up, status: 200},
			remaining(upstream{headers: [][2]string{{"x-usage", "0"}}, chunks: []string{`{"n":0}`}}, kept),
		}, metrics: map[string]int64{"rule.tokens.cost_missing": 1}})
	}
	run(t, table)
}

// TestResponseCostValues: in a JSON body, duplicate keys resolve to the
// last; a positive cost below MinCost is not a cost; nesting elsewhere has
// no depth limit. The body comes in two chunks.
func TestResponseCostValues(t *testing.T) {
	var table []timeline
	for _, c := range []struct {
		name, body, remaining string // remaining: after a second request that reserves 10
		missing               int64
	}{
		{"duplicate keys: the last", `{"n":5,"n":30}`, "60", 0},
		{"duplicate objects: the last", `{"u":{"n":5},"u":{"n":30}}`, "60", 0},
		{"tiny positive cost", `{"n":5e-324}`, "80", 1},
		{"below MinCost", `{"n":0.0009}`, "80", 1},
		{"MinCost", `{"n":0.001}`, "89", 0},
		{"zero", `{"n":0}`, "90", 0},
		{"deep nesting elsewhere", `{"x":` + strings.Repeat(`[{"a":`, 5000) + "1" + strings.Repeat(`}]`, 5000) + `,"n":30}`, "60", 0},
	} {
		path := "n"
		if strings.Contains(c.body, `"u"`) {
			path = "u.n"
		}
		table = append(table, timeline{name: c.name, cfg: budget("response_json:"+path, `"default_cost": 10`), steps: []exchange{
			{req: key, up: upstream{chunks: []string{c.body[:len(c.body)/2], c.body[len(c.body)/2:]}}},
			remaining(upstream{}, c.remaining),
		}, metrics: map[string]int64{"rule.tokens.cost_missing": c.missing + 1}}) // +1: the second request had no body
	}
	run(t, table)
}

// TestChargeOn: charge_on keeps a request's reservation only for the
// statuses it names (a class like 2xx, or one status); others give it
// back, each rule of a stack by its own charge_on; a rule whose cost is
// not from the response defines no cost_missing.
func TestChargeOn(t *testing.T) {
	logins := `{"rules": [{"name": "logins", "limit_keys": ["header:x-user"], "charge_on": ["401"],
	  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 5}}]}`
	user := []string{"x-user", "u"}
	run(t, []timeline{
		{name: "401s only: 200s pass, five 401s, then 429", cfg: logins, steps: []exchange{
			{times: 20, req: user, up: upstream{status: "200"}, status: 200, headers: map[string]string{"ratelimit-remaining": "5"}},
			{times: 5, req: user, up: upstream{status: "401"}, status: 200},
			{req: user, status: 429},
		}},
		// "ok" charges 2xx only, "all" every response: a 500 refunds "ok"
		// and keeps "all"; the headers show "all".
		{name: "classes, stacked", cfg: `{"rules": [
	  {"name": "ok", "charge_on": ["2xx"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 10}},
	  {"name": "all", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 10,
	    "cost_source": "response_header:x-cost", "default_cost": 2}}]}`, steps: []exchange{
			{up: upstream{status: "500", headers: [][2]string{{"x-cost", "3"}}}, headers: map[string]string{"ratelimit": `"all";r=7;t=300`}}, // ok 10, all 7
			{up: upstream{status: "204", headers: [][2]string{{"x-cost", "1"}}}, headers: map[string]string{"ratelimit": `"all";r=6;t=400`}}, // ok 9, all 6
		}},
	})
	w := newWorld(t, logins)
	w.do(user...)
	if w.h.Defined("rule.logins.cost_missing") {
		t.Error("cost_missing defined for a rule whose cost is not from the response")
	}
}

// TestShadowResponseCost: a shadow rule is charged like an enforced one and
// never rejects: its debt shows in shadow_rejected.
func TestShadowResponseCost(t *testing.T) {
	run(t, []timeline{{name: "three costs of 8 against 10",
		cfg: `{"rules": [{"name": "s", "mode": "shadow", "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 0.01, "burst": 10, "cost_source": "response_header:x-cost"}}]}`,
		steps:   []exchange{{times: 3, up: upstream{headers: [][2]string{{"x-cost", "8"}}}, status: 200, headers: map[string]string{"ratelimit": ""}}},
		metrics: map[string]int64{"rule.s.allowed": 2, "rule.s.shadow_rejected": 1}}})
}

// TestNoBodyReadWithoutResponseJSON: without a response_json rule the body
// is not read.
func TestNoBodyReadWithoutResponseJSON(t *testing.T) {
	w := newWorld(t, perKey)
	r := w.doUpstream(upstream{chunks: []string{`{"n":1}`}}, "x-api-key", "a")
	if r.stream.BodyRead != 0 {
		t.Fatalf("%d bytes of the body read", r.stream.BodyRead)
	}
}

// TestLostDebitCounted: a cost known from the response whose debit cannot
// be written is counted (failed_open: the request went through without
// paying), not only logged.
func TestLostDebitCounted(t *testing.T) {
	h := fakehost.New()
	sd := &fakehost.RefusingData{SD: h.SD}
	h.SD = sd
	w := newWorldOn(t, h, budget("response_header:x-usage", ""))
	s, r := w.open(key...)
	sd.Refuse, sd.Err = -1, errors.New("host: shared data unavailable")
	w.respond(s, r, upstream{headers: [][2]string{{"x-usage", "50"}}})
	w.end(s, r)
	if n := w.count("rule.tokens.failed_open"); n != 1 {
		t.Fatalf("failed_open %d after a lost debit, want 1", n)
	}
}
