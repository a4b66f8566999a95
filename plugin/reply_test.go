package plugin

import (
	"strings"
	"testing"
)

// TestResponsesTable pins each row of the responses table of docs/responses.md: the
// status, whether RateLimit headers and Retry-After come, and the body's
// error, for every reason a request is rejected.
func TestResponsesTable(t *testing.T) {
	const rule = `{"name": "r", "status": 403, "limit_keys": ["header:k"], "missing_key": "deny", "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 1, "burst": 2, "cost_source": "header:x-cost"}}`
	type row struct {
		status     int
		rateLimit  bool
		retryAfter string // "" none, "wait" a jittered wait, else exactly
		errName    string
	}
	check := func(t *testing.T, reason string, r response, want row) {
		t.Helper()
		if r.status != want.status || r.headers["x-ratelimit-reason"] != reason {
			t.Fatalf("%s: %d %q, want %d", reason, r.status, r.headers["x-ratelimit-reason"], want.status)
		}
		if got := r.headers["ratelimit"] != "" && r.headers["ratelimit-policy"] != "" && r.headers["ratelimit-remaining"] != ""; got != want.rateLimit {
			t.Errorf("%s: RateLimit headers %v, want %v (%v)", reason, got, want.rateLimit, r.headers)
		}
		switch ra := r.headers["retry-after"]; want.retryAfter {
		case "wait":
			if ra == "" || ra == "0" {
				t.Errorf("%s: Retry-After %q, want a wait", reason, ra)
			}
		default:
			if ra != want.retryAfter {
				t.Errorf("%s: Retry-After %q, want %q", reason, ra, want.retryAfter)
			}
		}
		if !strings.HasPrefix(r.body, `{"error":"`+want.errName+`","rule":"r","reason":"`+reason+`"`) {
			t.Errorf("%s: body %s, want error %q", reason, r.body, want.errName)
		}
	}
	t.Run("local", func(t *testing.T) {
		e := start(t, rules(``, rule))
		e.statuses(2, "k", "a")
		check(t, "token_bucket_exceeded", e.do("k", "a"), row{403, true, "wait", "rate_limited"})
		check(t, "cost_exceeds_burst", e.do("k", "b", "x-cost", "3"), row{403, false, "", "rate_limited"})
		check(t, "missing_limit_key", e.do(), row{400, false, "", "bad_request"})
	})
	t.Run("limit service down", func(t *testing.T) {
		e := start(t, `{"service": {"cluster": "limit_service", "failure_mode": "deny"}, "rules": [`+
			strings.Replace(rule, `"limit_keys"`, `"scope": "cluster", "limit_keys"`, 1)+`]}`)
		id, _ := e.callout("k", "a")
		e.host.CallOnHttpCallResponse(e.host.GetCalloutAttributesFromContext(id)[0].CalloutID, nil, nil, nil)
		lr := e.host.GetSentLocalResponse(id)
		if lr == nil {
			t.Fatal("no reply")
		}
		r := response{status: int(lr.StatusCode), body: string(lr.Data), headers: map[string]string{}}
		for _, h := range lr.Headers {
			r.headers[h[0]] = h[1]
		}
		check(t, "limit_service_unavailable", r, row{403, false, "1", "rate_limited"})
	})
}
