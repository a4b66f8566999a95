package engine

import (
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/config"
)

// perUser: one request per user of the body (request_json:user.id), for
// the model gpt-4o only (a match on request_json:model); a body without a
// user is refused.
const perUser = `{"rules": [{"name": "users", "limit_keys": ["request_json:user.id"], "missing_key": "deny",
  "match": {"request_json:model": {"equals": "gpt-4o"}},
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}}]}`

// sendBody runs a POST whose body comes in chunks: the actions of the
// headers and of each chunk.
func sendBody(p *Plugin, s *fakeStream, chunks ...string) (*Request, []Action) {
	r := p.NewRequest(s)
	acts := []Action{r.OnRequestHeadersWithBody()}
	for i, c := range chunks {
		s.reqChunk = []byte(c)
		acts = append(acts, r.OnRequestBody(len(c), i == len(chunks)-1))
	}
	return r, acts
}

func TestRequestJSONKeysAndMatch(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, perUser)
	body := `{"model":"gpt-4o","user":{"id":"u1"},"messages":[{"role":"user","content":"hi"}]}`
	// The decision waits for the body's end: the headers and the first
	// chunk hold the request, the last decides it.
	_, acts := sendBody(p, newFakeStream(":method", "POST"), body[:20], body[20:])
	if acts[0] != Pause || acts[1] != Pause || acts[2] != Continue {
		t.Fatalf("u1: actions %v, want [Pause Pause Continue]", acts)
	}
	// u1 again: refused at the body's end.
	s := newFakeStream(":method", "POST")
	_, acts = sendBody(p, s, body)
	if acts[1] != Pause || s.replied != 429 {
		t.Fatalf("u1 again: %v, status %d", acts, s.replied)
	}
	// u2 has a bucket of its own.
	s = newFakeStream(":method", "POST")
	if _, acts = sendBody(p, s, strings.Replace(body, "u1", "u2", 1)); acts[1] != Continue {
		t.Fatalf("u2: %v, status %d", acts, s.replied)
	}
	// Another model does not match: u1 passes.
	s = newFakeStream(":method", "POST")
	if _, acts = sendBody(p, s, strings.Replace(body, "gpt-4o", "o3", 1)); acts[1] != Continue {
		t.Fatalf("o3: %v, status %d", acts, s.replied)
	}
	// No user: missing_key deny.
	s = newFakeStream(":method", "POST")
	if _, acts = sendBody(p, s, `{"model":"gpt-4o"}`); acts[1] != Pause || s.replied != 400 {
		t.Fatalf("no user: %v, status %d", acts, s.replied)
	}
}

// TestRequestBodyBound: a body over config.MaxRequestBodyBytes, or one
// that is not JSON, is decided at once, as if it held no value; its rest
// is neither read nor held.
func TestRequestBodyBound(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []string
	}{
		{"over the bound", []string{`{"model":"gpt-4o","user":{"id":"u1"},"pad":"`, strings.Repeat("x", config.MaxRequestBodyBytes), `"}`}},
		{"not JSON", []string{`model=gpt-4o&user=u1`, `{"model":"gpt-4o","user":{"id":"u1"}}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost()
			p := newPlugin(t, h, perUser)
			s := newFakeStream(":method", "POST")
			_, acts := sendBody(p, s, tc.chunks...)
			// Decided as if the body held no value: the rule matches
			// nothing (no model), so the request goes on.
			if s.replied != 0 {
				t.Fatalf("status %d: a body without values matches no rule", s.replied)
			}
			if acts[len(acts)-1] != Continue || acts[len(acts)-2] != Continue {
				t.Fatalf("actions %v", acts)
			}
			if s.reqRead > 64<<10 {
				t.Errorf("read %d bytes of the body", s.reqRead)
			}
			if p.bodyHeld != 0 {
				t.Errorf("bodyHeld %d after the decision", p.bodyHeld)
			}
		})
	}
}

// TestNoRequestBodyRule: a configuration without request_json reads no
// request body: the request is decided at its headers.
func TestNoRequestBodyRule(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, tokens)
	s := newFakeStream("k", "a", ":method", "POST")
	r, acts := sendBody(p, s, `{"model":"x"}`)
	if acts[0] != Continue || acts[1] != Continue || s.reqRead != 0 {
		t.Fatalf("actions %v, read %d", acts, s.reqRead)
	}
	r.Done()
}

// TestRequestJSONPrices: the model and the reservation come from the
// request body; the response charges at that model's prices.
func TestRequestJSONPrices(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, moneyBudget("request_json:model", `, "reserve": {"source": "request_json:max_tokens", "price": "output"}`, threeModels))
	s := newFakeStream("x-team", "a", ":method", "POST")
	r, acts := sendBody(p, s, `{"model":"gpt-4o-mini","max_tokens":4000000,"messages":[]}`)
	if acts[1] != Continue {
		t.Fatalf("actions %v, status %d", acts, s.replied)
	}
	// $2.40 reserved of $50: a second request reserving $40 (gpt-4o) is
	// refused, $47.60 is left.
	s2 := newFakeStream("x-team", "a", ":method", "POST")
	if _, a2 := sendBody(p, s2, `{"model":"gpt-4o","max_tokens":4800000}`); a2[1] != Pause || s2.replied != 429 {
		t.Fatalf("second: %v, status %d", a2, s2.replied)
	}
	s.resp[":status"], s.resp["content-type"] = "200", "application/json"
	r.OnResponseHeaders(false)
	s.body = []byte(openAIBody)
	r.OnResponseBody(len(openAIBody), true)
	r.Done()
	want := int64(50e6 - micro([2]float64{1234, 0.15}, [2]float64{567, 0.6}, [2]float64{200, 0.075}))
	if got := remainingAfter(t, p); got != want {
		t.Errorf("remaining %d, want %d", got, want)
	}
}

// TestRequestBodyEndsBeforeItsEnd: a request that ends while its body is
// awaited gives its share of the scan budget back.
func TestRequestBodyEndsBeforeItsEnd(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, perUser)
	r := p.NewRequest(newFakeStream(":method", "POST"))
	if a := r.OnRequestHeadersWithBody(); a != Pause || p.bodyHeld == 0 {
		t.Fatalf("action %v, held %d", a, p.bodyHeld)
	}
	r.Done()
	if p.bodyHeld != 0 {
		t.Errorf("bodyHeld %d after Done", p.bodyHeld)
	}
}

// TestRequestBodyHeadersKept: a host may forget the request headers once
// they went on before the body (proxy-wasm does): the decision after the
// body reads the headers as they were at the headers callback.
func TestRequestBodyHeadersKept(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, moneyBudget("request_json:model", "", threeModels))
	s := newFakeStream("x-team", "a", ":method", "POST")
	r := p.NewRequest(s)
	if a := r.OnRequestHeadersWithBody(); a != Pause || !r.WaitsForBody() {
		t.Fatalf("action %v, waits %v", a, r.WaitsForBody())
	}
	s.req = map[string]string{} // gone with the headers
	body := `{"model":"gpt-4o"}`
	s.reqChunk = []byte(body)
	if a := r.OnRequestBody(len(body), true); a != Continue {
		t.Fatalf("body: %v", a)
	}
	s.resp[":status"] = "200"
	r.OnResponseHeaders(true)
	// The rule keyed by x-team decided it: its headers went out.
	if got := header(s.added, "ratelimit-remaining"); got != "49990000" {
		t.Errorf("ratelimit-remaining %q, want 49990000", got)
	}
}
