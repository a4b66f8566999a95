package engine_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// moneyBudget: $50 per team, prices per million tokens for three models and
// "*", usage from an OpenAI-style body or an Anthropic stream, a
// reservation of max_tokens at the output price or $0.01.
func moneyBudget(model, reserve, table string) string {
	return `{"rules": [{"name": "spend", "limit_keys": ["header:x-team"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 0.0001, "burst": 50, "default_cost": 0.01,
  "prices": {"model": "` + model + `", "per": 1000000, "table": {` + table + `}},
  "cost_terms": [{"source": "response_json:usage.prompt_tokens", "price": "input"},
                 {"source": "response_json:usage.completion_tokens", "price": "output"},
                 {"source": "response_json:usage.prompt_tokens_details.cached_tokens", "price": "cached_input"},
                 {"source": "response_json:message.usage.input_tokens", "price": "input"},
                 {"source": "response_json:usage.output_tokens", "price": "output"}]` + reserve + `}}]}`
}

const threeModels = `"gpt-4o": {"input": 2.5, "output": 10, "cached_input": 1.25},
	"gpt-4o-mini": {"input": 0.15, "output": 0.6, "cached_input": 0.075},
	"claude-sonnet": {"input": 3, "output": 15}, "*": {"input": 1, "output": 4}`

const (
	openAIBody = `{"id":"x","usage":{"prompt_tokens":1234,"completion_tokens":567,"prompt_tokens_details":{"cached_tokens":200}}}`
	// An Anthropic Messages stream: input_tokens in message_start,
	// output_tokens in message_delta, then message_stop.
	anthropicStart = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3001,\"output_tokens\":1}}}\n\n"
	anthropicDelta = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":777}}\n\n"
	anthropicStop  = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
)

// micro is usage × price (per million) in millionths, rounded up: the
// ledger the tests compare with, computed apart from the engine.
func micro(terms ...[2]float64) float64 {
	var num float64 // exact: well within 2^53
	for _, t := range terms {
		num += t[0] * t[1] * 1e6
	}
	q := float64(int64(num) / 1e6)
	if q*1e6 < num {
		q++
	}
	return q
}

// spend runs one request of team with the request headers kv, a response
// of content type ct made of chunks (end: its last chunk ends it; else
// the client leaves), and returns what the next request of the team sees
// remaining (in millionths) less its own reservation.
func spend(t *testing.T, p *engine.Plugin, ct string, chunks []string, end bool, kv ...string) int64 {
	t.Helper()
	s := newStream(append([]string{"x-team", "a"}, kv...)...)
	r := p.NewRequest(s)
	if a := r.OnRequestHeaders(); a != engine.Continue {
		t.Fatalf("request: %v", a)
	}
	s.Resp[":status"], s.Resp["content-type"] = "200", ct
	r.OnResponseHeaders(false)
	for i, c := range chunks {
		s.Body = []byte(c)
		r.OnResponseBody(len(c), end && i == len(chunks)-1)
	}
	r.Done()
	return remainingAfter(t, p)
}

func remainingAfter(t *testing.T, p *engine.Plugin) int64 {
	t.Helper()
	s := newStream("x-team", "a", "x-model", "gpt-4o")
	r := p.NewRequest(s)
	r.OnRequestHeaders()
	s.Resp[":status"] = "200"
	r.OnResponseHeaders(true) // no body: its cost is missing, the reservation stands
	v, err := strconv.ParseInt(header(s.Added, "ratelimit-remaining"), 10, 64)
	if err != nil {
		t.Fatalf("ratelimit-remaining %q", header(s.Added, "ratelimit-remaining"))
	}
	return v + 10000 // its reservation, $0.01
}

func TestMoneyCharges(t *testing.T) {
	const full = 50e6
	for _, tc := range []struct {
		name   string
		model  string // x-model; "" for none
		ct     string
		chunks []string
		end    bool
		want   float64 // millionths charged
		trunc  int64
	}{
		{"gpt-4o, every term", "gpt-4o", "application/json", []string{openAIBody}, true,
			micro([2]float64{1234, 2.5}, [2]float64{567, 10}, [2]float64{200, 1.25}), 0},
		{"gpt-4o-mini, rounded up to a millionth", "gpt-4o-mini", "application/json", []string{openAIBody}, true,
			micro([2]float64{1234, 0.15}, [2]float64{567, 0.6}, [2]float64{200, 0.075}), 0},
		{"unlisted model takes \"*\" (cached_input absent: 0)", "llama", "application/json", []string{openAIBody}, true,
			micro([2]float64{1234, 1}, [2]float64{567, 4}), 0},
		{"no model takes \"*\"", "", "application/json", []string{openAIBody}, true,
			micro([2]float64{1234, 1}, [2]float64{567, 4}), 0},
		{"a body in pieces", "gpt-4o", "application/json", []string{openAIBody[:17], openAIBody[17:40], openAIBody[40:]}, true,
			micro([2]float64{1234, 2.5}, [2]float64{567, 10}, [2]float64{200, 1.25}), 0},
		{"missing terms count 0", "gpt-4o", "application/json", []string{`{"usage":{"completion_tokens":10}}`}, true,
			micro([2]float64{10, 10}), 0},
		{"no term at all: the reservation stands", "gpt-4o", "application/json", []string{`{"usage":{}}`}, true, 10000, 0},
		{"Anthropic stream", "claude-sonnet", "text/event-stream", []string{anthropicStart, anthropicDelta, anthropicStop}, true,
			micro([2]float64{3001, 3}, [2]float64{777, 15}), 0},
		{"Anthropic stream left after message_stop", "claude-sonnet", "text/event-stream", []string{anthropicStart, anthropicDelta, anthropicStop}, false,
			micro([2]float64{3001, 3}, [2]float64{777, 15}), 0},
		{"stream cut before its end: the reservation", "claude-sonnet", "text/event-stream", []string{anthropicStart, anthropicDelta}, false, 10000, 1},
		{"plain body cut: the reservation", "gpt-4o", "application/json", []string{openAIBody[:30]}, false, 10000, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := fakehost.New()
			p := newPlugin(t, h, moneyBudget("header:x-model", "", threeModels))
			var kv []string
			if tc.model != "" {
				kv = []string{"x-model", tc.model}
			}
			got := spend(t, p, tc.ct, tc.chunks, tc.end, kv...)
			if want := int64(full - tc.want); got != want {
				t.Errorf("remaining %d, want %d (charged %v)", got, want, tc.want)
			}
			if n := h.Count("rule.spend.cost_truncated"); n != tc.trunc {
				t.Errorf("cost_truncated = %d, want %d", n, tc.trunc)
			}
		})
	}
}

// TestMoneyReserve: a request reserves max_tokens at its model's output
// price; a request over what is left is refused, one within it admitted,
// and the response then charges what it used.
func TestMoneyReserve(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, moneyBudget("header:x-model", `, "reserve": {"source": "header:x-max-tokens", "price": "output"}`, threeModels))
	// max_tokens 4,000,000 at $10 a million: $40 reserved of $50.
	s := newStream("x-team", "a", "x-model", "gpt-4o", "x-max-tokens", "4000000")
	r := p.NewRequest(s)
	if a := r.OnRequestHeaders(); a != engine.Continue {
		t.Fatalf("first request: %v", a)
	}
	// A second request reserving $40 is refused: $10 left.
	s2 := newStream("x-team", "a", "x-model", "gpt-4o", "x-max-tokens", "4000000")
	if a := p.NewRequest(s2).OnRequestHeaders(); a != engine.Pause || s2.Replied != 429 {
		t.Fatalf("second request: %v, status %d", a, s2.Replied)
	}
	s.Resp[":status"], s.Resp["content-type"] = "200", "application/json"
	r.OnResponseHeaders(false)
	s.Body = []byte(openAIBody)
	r.OnResponseBody(len(openAIBody), true)
	r.Done()
	want := int64(50e6 - micro([2]float64{1234, 2.5}, [2]float64{567, 10}, [2]float64{200, 1.25}))
	if got := remainingAfter(t, p); got != want {
		t.Errorf("remaining %d, want %d", got, want)
	}
}

// TestMoneyPriceMissing: with no "*", a model the table does not price
// keeps its reservation and counts in price_missing.
func TestMoneyPriceMissing(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, moneyBudget("header:x-model", "", `"gpt-4o": {"input": 2.5, "output": 10, "cached_input": 1.25}`))
	got := spend(t, p, "application/json", []string{openAIBody}, true, "x-model", "llama")
	if got != 50e6-10000 {
		t.Errorf("remaining %d, want %d", got, int64(50e6-10000))
	}
	if n := h.Count("rule.spend.price_missing"); n != 1 {
		t.Errorf("price_missing = %d, want 1", n)
	}
}

// dailyMoney: "$50 a day" per team in Europe/Berlin, priced by the
// request body's model, a reservation of max_tokens at the output price.
const dailyMoney = `{"rules": [{"name": "daily", "limit_keys": ["header:x-team"], "algorithm": "quota",
  "algorithm_config": {"limit": 50, "period": "day", "time_zone": "Europe/Berlin", "default_cost": 0.01,
  "prices": {"model": "request_json:model", "per": 1000000, "table": {` + threeModels + `}},
  "cost_terms": [{"source": "response_json:usage.prompt_tokens", "price": "input"},
                 {"source": "response_json:usage.completion_tokens", "price": "output"},
                 {"source": "response_json:usage.prompt_tokens_details.cached_tokens", "price": "cached_input"}],
  "reserve": {"source": "request_json:max_tokens", "price": "output"}}}]}`

// TestMoneyQuota: a day's $50 counted in millionths: a request reserves
// its max_tokens, the response charges its usage exactly, the headers
// report millionths and the seconds to Berlin's midnight, and a request
// over what is left waits for it.
func TestMoneyQuota(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, dailyMoney)
	at := time.Date(2026, 3, 29, 20, 0, 0, 0, time.UTC) // 22:00 in Berlin (CEST since 01:00 UTC): 2 h to midnight
	h.Clock.Set(at.UnixNano())
	post := func(body string) (*stream, *engine.Request, []engine.Action) {
		s := newStream("x-team", "a", ":method", "POST")
		r, acts := sendBody(p, s, body)
		return s, r, acts
	}
	// $40 reserved (4,000,000 tokens at $10 a million).
	s, r, acts := post(`{"model":"gpt-4o","max_tokens":4000000}`)
	if acts[1] != engine.Continue {
		t.Fatalf("first: %v, status %d", acts, s.Replied)
	}
	// Another $40 does not fit in the $10 left: refused until midnight.
	s2, _, acts2 := post(`{"model":"gpt-4o","max_tokens":4000000}`)
	if acts2[1] != engine.Pause || s2.Replied != 429 {
		t.Fatalf("second: %v, status %d", acts2, s2.Replied)
	}
	retryWithin(t, headerOf(s2.ReplyHeaders, "retry-after"), 7200)
	s.Resp[":status"], s.Resp["content-type"] = "200", "application/json"
	r.OnResponseHeaders(false)
	if got := header(s.Added, "ratelimit-policy"); got != `"daily";q=50000000;w=82800` { // 29 March: the day clocks go forward, 23 hours
		t.Errorf("RateLimit-Policy %q", got)
	}
	s.Body = []byte(openAIBody)
	r.OnResponseBody(len(openAIBody), true)
	r.Done()
	charged := int64(micro([2]float64{1234, 2.5}, [2]float64{567, 10}, [2]float64{200, 1.25}))
	// A probe of $0.01 sees the rest.
	s3, r3, _ := post(`{"model":"gpt-4o","max_tokens":1000}`)
	s3.Resp[":status"] = "200"
	r3.OnResponseHeaders(true)
	r3.Done()
	if got, want := header(s3.Added, "ratelimit"), `"daily";r=`+strconv.FormatInt(50e6-charged-10000, 10)+";t=7200"; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	// At Berlin's midnight the day is full again.
	h.Clock.Set(time.Date(2026, 3, 29, 22, 0, 0, 0, time.UTC).UnixNano())
	s4, r4, _ := post(`{"model":"gpt-4o","max_tokens":4000000}`)
	if s4.Replied != 0 {
		t.Fatalf("after midnight: status %d", s4.Replied)
	}
	s4.Resp[":status"] = "200"
	r4.OnResponseHeaders(true)
	if got := header(s4.Added, "ratelimit"); got != `"daily";r=10000000;t=86400` {
		t.Errorf("after midnight: RateLimit %q", got)
	}
}

// BenchmarkMoneyRequest: one allowed request with an OpenAI-style JSON
// answer, through a token budget (response_json), a price table whose
// model is a header, and one whose model and reservation come from the
// request body (request_json).
func BenchmarkMoneyRequest(b *testing.B) {
	terms := `"cost_terms": [{"source": "response_json:usage.prompt_tokens", "price": "input"},
	  {"source": "response_json:usage.completion_tokens", "price": "output"},
	  {"source": "response_json:usage.prompt_tokens_details.cached_tokens", "price": "cached_input"}]`
	for _, tc := range []struct {
		name, cfg string
		body      bool
	}{
		{"tokens", `{"rules": [{"name": "r", "limit_keys": ["header:x-team"], "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 1e9, "burst": 1e12, "cost_source": "response_json:usage.prompt_tokens"}}]}`, false},
		{"money_model_header", `{"rules": [{"name": "r", "limit_keys": ["header:x-team"], "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 1000, "burst": 1000000, "prices": {"model": "header:x-model", "per": 1000000,
		  "table": {` + threeModels + `}}, ` + terms + `}}]}`, false},
		{"money_model_request_json", `{"rules": [{"name": "r", "limit_keys": ["header:x-team"], "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 1000, "burst": 1000000, "prices": {"model": "request_json:model", "per": 1000000,
		  "table": {` + threeModels + `}}, ` + terms + `, "reserve": {"source": "request_json:max_tokens", "price": "output"}}}]}`, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := fakehost.New()
			p := newPlugin(b, h, tc.cfg)
			s := newStream("x-team", "a", "x-model", "gpt-4o")
			s.Resp[":status"], s.Resp["content-type"] = "200", "application/json"
			s.Body = []byte(openAIBody)
			s.ReqBody = []byte(`{"model":"gpt-4o","max_tokens":1000,"messages":[{"role":"user","content":"hello"}]}`)
			b.ReportAllocs()
			for b.Loop() {
				h.Clock.Advance(1000)
				s.Added, s.Replied = s.Added[:0], 0
				r := p.NewRequest(s)
				if tc.body {
					r.OnRequestHeadersWithBody()
					r.OnRequestBody(len(s.ReqBody), true)
				} else {
					r.OnRequestHeaders()
				}
				r.OnResponseHeaders(false)
				r.OnResponseBody(len(s.Body), true)
				r.Done()
				if s.Replied != 0 {
					b.Fatal("refused")
				}
			}
		})
	}
}
