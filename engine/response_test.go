package engine_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// tokens: a budget of 10,000 tokens per key whose cost is the usage an
// event stream reports; a reservation of 10, and truncated_cost 5,000.
const tokens = `{"rules": [{"name": "tokens", "limit_keys": ["header:k"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 0.001, "burst": 10000,
  "cost_source": "response_json:usage.total_tokens", "default_cost": 10, "truncated_cost": 5000}}]}`

// Events of an OpenAI chat completions stream (stream_options
// include_usage: the usage comes in a last chunk with no choices, then
// [DONE]), one an upstream sends before the real usage with an early
// partial count, and those of an Anthropic Messages stream (message_delta
// carries the cumulative usage, message_stop ends it).
const (
	partialEvent  = "data: {\"usage\":{\"total_tokens\":1}}\n\n"
	contentEvent  = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n"
	finishEvent   = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"
	usageEvent    = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":2000,\"total_tokens\":3000}}\n\n"
	doneEvent     = "data: [DONE]\n\n"
	startEvent    = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"total_tokens\":1}}}\n\n"
	deltaEvent    = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"total_tokens\":3000}}\n\n"
	messageStop   = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	runningDelta  = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"total_tokens\":1}}\n\n"
	truncatedCost = 5000
)

// TestStreamCostOnlyWhenFinal: an event stream's count is its bill only
// when the stream marks it final (an end event after it) or the stream
// ends normally; a client that leaves earlier, after a partial count
// (what a client that closes at finish_reason sees), is charged
// truncated_cost, never the partial count.
func TestStreamCostOnlyWhenFinal(t *testing.T) {
	for _, tc := range []struct {
		name      string
		events    []string
		end       bool    // the stream ends normally (else the client leaves)
		charged   float64 // what the request cost in all
		truncated int64
	}{
		{"left at finish_reason after a partial count", []string{partialEvent, contentEvent, finishEvent}, false, truncatedCost, 1},
		{"left after the usage, before [DONE]", []string{partialEvent, contentEvent, finishEvent, usageEvent}, false, truncatedCost, 1},
		{"left after [DONE]", []string{partialEvent, contentEvent, finishEvent, usageEvent, doneEvent}, false, 3000, 0},
		{"ended after a partial count", []string{partialEvent, contentEvent, finishEvent}, true, 1, 0},
		{"ended after the usage", []string{partialEvent, contentEvent, usageEvent}, true, 3000, 0},
		{"Anthropic: left after message_delta", []string{startEvent, runningDelta, deltaEvent}, false, truncatedCost, 1},
		{"Anthropic: left after message_stop", []string{startEvent, runningDelta, deltaEvent, messageStop}, false, 3000, 0},
		{"a count after the end event runs again", []string{usageEvent, doneEvent, partialEvent}, false, truncatedCost, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := fakehost.New()
			p := newPlugin(t, h, tokens)
			s := newStream("k", "a")
			r := p.NewRequest(s)
			if a := r.OnRequestHeaders(); a != engine.Continue {
				t.Fatalf("request: %v", a)
			}
			s.Resp[":status"], s.Resp["content-type"] = "200", "text/event-stream"
			r.OnResponseHeaders(false)
			for i, e := range tc.events {
				s.Body = []byte(e)
				r.OnResponseBody(len(e), tc.end && i == len(tc.events)-1)
			}
			r.Done()
			if got := h.Count("rule.tokens.cost_truncated"); got != tc.truncated {
				t.Errorf("cost_truncated = %d, want %d", got, tc.truncated)
			}
			// The next request reserves 10 and shows what is left.
			s2 := newStream("k", "a")
			r2 := p.NewRequest(s2)
			r2.OnRequestHeaders()
			s2.Resp[":status"] = "200"
			r2.OnResponseHeaders(true)
			want := strconv.FormatFloat(10000-tc.charged-10, 'f', -1, 64)
			if got := header(s2.Added, "ratelimit-remaining"); got != want {
				t.Errorf("remaining %q, want %s (charged %v)", got, want, tc.charged)
			}
		})
	}
}

// header is the value of the added header name, or "".
func header(added [][2]string, name string) string {
	for _, h := range added {
		if strings.EqualFold(h[0], name) {
			return h[1]
		}
	}
	return ""
}
