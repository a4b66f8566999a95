package engine_test

import (
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// perUser: one request per user of the body (request_json:user.id), for
// the model gpt-4o only (a match on request_json:model); a body without a
// user is refused.
const perUser = `{"rules": [{"name": "users", "limit_keys": ["request_json:user.id"], "missing_key": "deny",
  "match": {"request_json:model": {"equals": "gpt-4o"}},
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}}]}`

// sendBody runs a POST whose body comes in chunks: the actions of the
// headers and of each chunk.
func sendBody(p *engine.Plugin, s *stream, chunks ...string) (*engine.Request, []engine.Action) {
	r := p.NewRequest(s)
	acts := []engine.Action{r.OnRequestHeadersWithBody()}
	for i, c := range chunks {
		s.ReqBody = []byte(c)
		acts = append(acts, r.OnRequestBody(len(c), i == len(chunks)-1))
	}
	return r, acts
}

// oneHold is a Plugin on perUser whose budget of body scans is one
// request's (two request_json paths, a scan each): a request is held for
// its body only while no other is.
func oneHold(t *testing.T) *engine.Plugin {
	t.Helper()
	p, err := engine.New(fakehost.New(), []byte(perUser), "", engine.Options{BodyBudget: 2 * engine.ScanBytes})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// budgetFree reports whether p's budget holds a request's body: a request
// is held for it (and then ended). Past the budget the request is decided
// at its headers, without the body's values.
func budgetFree(p *engine.Plugin) bool {
	r := p.NewRequest(newStream(":method", "POST"))
	a := r.OnRequestHeadersWithBody()
	r.Done()
	return a == engine.Pause
}

func TestRequestJSONKeysAndMatch(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, perUser)
	body := `{"model":"gpt-4o","user":{"id":"u1"},"messages":[{"role":"user","content":"hi"}]}`
	// The decision waits for the body's end: the headers and the first
	// chunk hold the request, the last decides it.
	_, acts := sendBody(p, newStream(":method", "POST"), body[:20], body[20:])
	if acts[0] != engine.Pause || acts[1] != engine.Pause || acts[2] != engine.Continue {
		t.Fatalf("u1: actions %v, want [Pause Pause Continue]", acts)
	}
	// u1 again: refused at the body's end.
	s := newStream(":method", "POST")
	_, acts = sendBody(p, s, body)
	if acts[1] != engine.Pause || s.Replied != 429 {
		t.Fatalf("u1 again: %v, status %d", acts, s.Replied)
	}
	// u2 has a bucket of its own.
	s = newStream(":method", "POST")
	if _, acts = sendBody(p, s, strings.Replace(body, "u1", "u2", 1)); acts[1] != engine.Continue {
		t.Fatalf("u2: %v, status %d", acts, s.Replied)
	}
	// Another model does not match: u1 passes.
	s = newStream(":method", "POST")
	if _, acts = sendBody(p, s, strings.Replace(body, "gpt-4o", "o3", 1)); acts[1] != engine.Continue {
		t.Fatalf("o3: %v, status %d", acts, s.Replied)
	}
	// No user: missing_key deny.
	s = newStream(":method", "POST")
	if _, acts = sendBody(p, s, `{"model":"gpt-4o"}`); acts[1] != engine.Pause || s.Replied != 400 {
		t.Fatalf("no user: %v, status %d", acts, s.Replied)
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
			p := oneHold(t)
			s := newStream(":method", "POST")
			_, acts := sendBody(p, s, tc.chunks...)
			// Decided as if the body held no value: the rule matches
			// nothing (no model), so the request goes on.
			if s.Replied != 0 {
				t.Fatalf("status %d: a body without values matches no rule", s.Replied)
			}
			if acts[len(acts)-1] != engine.Continue || acts[len(acts)-2] != engine.Continue {
				t.Fatalf("actions %v", acts)
			}
			if s.ReqBodyRead > 64<<10 {
				t.Errorf("read %d bytes of the body", s.ReqBodyRead)
			}
			if !budgetFree(p) {
				t.Errorf("after the decision the scan budget holds no other request's body")
			}
		})
	}
}

// TestNoRequestBodyRule: a configuration without request_json reads no
// request body: the request is decided at its headers.
func TestNoRequestBodyRule(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, tokens)
	s := newStream("k", "a", ":method", "POST")
	r, acts := sendBody(p, s, `{"model":"x"}`)
	if acts[0] != engine.Continue || acts[1] != engine.Continue || s.ReqBodyRead != 0 {
		t.Fatalf("actions %v, read %d", acts, s.ReqBodyRead)
	}
	r.Done()
}

// TestRequestJSONPrices: the model and the reservation come from the
// request body; the response charges at that model's prices.
func TestRequestJSONPrices(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, moneyBudget("request_json:model", `, "reserve": {"source": "request_json:max_tokens", "price": "output"}`, threeModels))
	s := newStream("x-team", "a", ":method", "POST")
	r, acts := sendBody(p, s, `{"model":"gpt-4o-mini","max_tokens":4000000,"messages":[]}`)
	if acts[1] != engine.Continue {
		t.Fatalf("actions %v, status %d", acts, s.Replied)
	}
	// $2.40 reserved of $50: a second request reserving $40 (gpt-4o) is
	// refused, $47.60 is left.
	s2 := newStream("x-team", "a", ":method", "POST")
	if _, a2 := sendBody(p, s2, `{"model":"gpt-4o","max_tokens":4800000}`); a2[1] != engine.Pause || s2.Replied != 429 {
		t.Fatalf("second: %v, status %d", a2, s2.Replied)
	}
	s.Resp[":status"], s.Resp["content-type"] = "200", "application/json"
	r.OnResponseHeaders(false)
	s.Body = []byte(openAIBody)
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
	p := oneHold(t)
	r := p.NewRequest(newStream(":method", "POST"))
	if a := r.OnRequestHeadersWithBody(); a != engine.Pause || budgetFree(p) {
		t.Fatalf("action %v, budget free %v; want the request held, holding the budget", a, budgetFree(p))
	}
	r.Done()
	if !budgetFree(p) {
		t.Errorf("after Done the scan budget holds no other request's body")
	}
}

// TestRequestBodyHeadersKept: a host may forget the request headers once
// they went on before the body (proxy-wasm does): the decision after the
// body reads the headers as they were at the headers callback.
func TestRequestBodyHeadersKept(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, moneyBudget("request_json:model", "", threeModels))
	s := newStream("x-team", "a", ":method", "POST")
	r := p.NewRequest(s)
	if a := r.OnRequestHeadersWithBody(); a != engine.Pause || !r.WaitsForBody() {
		t.Fatalf("action %v, waits %v", a, r.WaitsForBody())
	}
	s.Req = map[string]string{} // gone with the headers
	body := `{"model":"gpt-4o"}`
	s.ReqBody = []byte(body)
	if a := r.OnRequestBody(len(body), true); a != engine.Continue {
		t.Fatalf("body: %v", a)
	}
	s.Resp[":status"] = "200"
	r.OnResponseHeaders(true)
	// The rule keyed by x-team decided it: its headers went out.
	if got := header(s.Added, "ratelimit-remaining"); got != "49990000" {
		t.Errorf("ratelimit-remaining %q, want 49990000", got)
	}
}
