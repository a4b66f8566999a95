package engine_test

import (
	"strconv"
	"strings"
	"testing"
)

// perKey: 4 tokens per x-api-key, 2 a second, the cost from x-cost.
const perKey = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 2, "burst": 4, "cost_source": "header:x-cost", "default_cost": 1}}]}`

// TestBurstRefillAndHeaders: a burst, then refill, with the RateLimit
// headers on every answer; keys are isolated.
func TestBurstRefillAndHeaders(t *testing.T) {
	admitted := func(r, reset int) exchange {
		return exchange{req: []string{"x-api-key", "a"}, status: 200, headers: map[string]string{
			"ratelimit-policy":    `"per-key";q=4;w=2`,
			"ratelimit":           `"per-key";r=` + strconv.Itoa(r) + ";t=" + strconv.Itoa(reset),
			"ratelimit-limit":     "4",
			"ratelimit-remaining": strconv.Itoa(r),
			"ratelimit-reset":     strconv.Itoa(reset),
		}}
	}
	run(t, []timeline{{name: "burst 4 at 2 a second", cfg: perKey,
		steps: []exchange{
			admitted(3, 1), admitted(2, 1), admitted(1, 2), admitted(0, 2),
			// base 1 s (0.5 s rounded up), at most 1.5 × base
			{req: []string{"x-api-key", "a"}, status: 429, body: `"reason":"token_bucket_exceeded"`, headers: map[string]string{
				"retry-after": "1", "x-ratelimit-reason": "token_bucket_exceeded", "ratelimit": `"per-key";r=0;t=1`}},
			{req: []string{"x-api-key", "b"}, status: 200},
			{wait: sec / 2, req: []string{"x-api-key", "a"}, status: 200}, // one token back
			{req: []string{"x-api-key", "a"}, status: 429},
		},
		metrics: map[string]int64{"rule.per-key.allowed": 6, "rule.per-key.rejected": 2}}})
}

// TestRetryAfterJitter: Retry-After is the wait plus a jitter of up to half
// of it, the same for a client each time, different across clients.
func TestRetryAfterJitter(t *testing.T) {
	w := newWorld(t, rules(``, limitRule("slow", `, "limit_keys": ["header:k"]`, "0.1", "1")))
	seen := map[string]bool{}
	for i := range 40 {
		k := "client-" + strconv.Itoa(i)
		w.do("k", k)
		r := w.do("k", k)
		ra, err := strconv.Atoi(r.headers["retry-after"])
		if r.status != 429 || err != nil || ra < 10 || ra > 15 {
			t.Fatalf("client %d: status %d retry-after %q, want 429 within [10, 15]", i, r.status, r.headers["retry-after"])
		}
		if again := w.do("k", k); again.headers["retry-after"] != r.headers["retry-after"] {
			t.Fatalf("client %d: retry-after changed from %s to %s", i, r.headers["retry-after"], again.headers["retry-after"])
		}
		seen[r.headers["retry-after"]] = true
	}
	if len(seen) < 3 {
		t.Errorf("retry-after took only %d values over 40 clients: no jitter", len(seen))
	}
}

// TestResponsesTable pins each row of the responses table of
// docs/responses.md: the status, whether RateLimit headers and Retry-After
// come, and the body's error, for every reason a request is rejected.
func TestResponsesTable(t *testing.T) {
	const r = `{"name": "r", "status": 403, "limit_keys": ["header:k"], "missing_key": "deny", "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 1, "burst": 2, "cost_source": "header:x-cost"}}`
	// rejected is the reply for reason: status, with RateLimit headers or
	// none, Retry-After ("" none, "wait" a jittered wait, else exactly),
	// and the body's error.
	rejected := func(req []string, reason string, status int, rateLimit bool, retryAfter, errName string) exchange {
		hs := map[string]string{"x-ratelimit-reason": reason}
		if !rateLimit {
			hs["ratelimit"], hs["ratelimit-policy"], hs["ratelimit-remaining"] = "", "", ""
		}
		if retryAfter != "wait" {
			hs["retry-after"] = retryAfter
		}
		return exchange{req: req, status: status, headers: hs, body: `{"error":"` + errName + `","rule":"r","reason":"` + reason + `"`}
	}
	run(t, []timeline{
		{name: "token_bucket_exceeded", cfg: rules(``, r), steps: []exchange{
			{times: 2, req: []string{"k", "a"}},
			rejected([]string{"k", "a"}, "token_bucket_exceeded", 403, true, "wait", "rate_limited")}},
		{name: "cost_exceeds_burst", cfg: rules(``, r), steps: []exchange{
			rejected([]string{"k", "b", "x-cost", "3"}, "cost_exceeds_burst", 403, false, "", "rate_limited")}},
		{name: "missing_limit_key", cfg: rules(``, r), steps: []exchange{
			rejected(nil, "missing_limit_key", 400, false, "", "bad_request")}},
		{name: "limit service down", down: true,
			cfg: `{"service": {"cluster": "limit_service", "failure_mode": "deny"}, "rules": [` +
				strings.Replace(r, `"limit_keys"`, `"scope": "cluster", "limit_keys"`, 1) + `]}`,
			steps: []exchange{rejected([]string{"k", "a"}, "limit_service_unavailable", 403, false, "1", "rate_limited")}},
	})
	// token_bucket_exceeded has RateLimit headers and a wait.
	w := newWorld(t, rules(``, r))
	w.statuses(2, "k", "a")
	if got := w.do("k", "a"); got.headers["ratelimit"] == "" || got.headers["ratelimit-policy"] == "" ||
		got.headers["ratelimit-remaining"] == "" || got.headers["retry-after"] == "" || got.headers["retry-after"] == "0" {
		t.Fatalf("token_bucket_exceeded: %v, want RateLimit headers and a wait", got.headers)
	}
}

// TestHeaderStyles: the rule's status, body and response headers replace
// the rejection's; the headers style is legacy (X-RateLimit-* only, here
// ratelimit-limit), draft or none (Retry-After stays).
func TestHeaderStyles(t *testing.T) {
	run(t, []timeline{
		{name: "legacy, a custom rejection",
			cfg: rules(`"headers": "legacy", `, limitRule("k", `, "status": 503, "body": "slow down",
	  "response_headers": {"x-team": "payments"}, "limit_keys": ["header:k"]`, "1", "1")),
			steps: []exchange{
				{req: []string{"k", "a"}, status: 200, headers: map[string]string{"ratelimit-limit": "1", "ratelimit": "", "ratelimit-policy": ""}},
				{req: []string{"k", "a"}, status: 503, body: "slow down", headers: map[string]string{"x-team": "payments"}}}},
		{name: "none",
			cfg: rules(`"headers": "none", `, limitRule("k", `, "limit_keys": ["header:k"]`, "1", "1")),
			steps: []exchange{
				{req: []string{"k", "a"}, status: 200, headers: map[string]string{"ratelimit-limit": "", "ratelimit": "", "ratelimit-remaining": ""}},
				{req: []string{"k", "a"}, status: 429, headers: map[string]string{"retry-after": "1", "ratelimit": ""}}}},
	})
	// Style none adds no header at all to an admitted request.
	w := newWorld(t, rules(`"headers": "none", `, limitRule("k", `, "limit_keys": ["header:k"]`, "1", "1")))
	if r := w.do("k", "a"); len(r.headers) != 0 {
		t.Fatalf("style none added %v", r.headers)
	}
}
