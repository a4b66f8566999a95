package engine_test

import (
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// TestReusedRequestStartsClean: after Done a Request serves the next
// request of its stream (a host reuses its per-request state), which sees
// none of the first one's values, plan or headers.
func TestReusedRequestStartsClean(t *testing.T) {
	// A shadow rule stacked on the enforced one, as examples/shadow-rollout
	// has: the reused Request decides it too (its scratch space reused).
	w := newWorld(t, `{"rules": [{"name": "trial", "mode": "shadow", "limit_keys": ["header:x-api-key"], "missing_key": "skip",
	  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 1}},
	 {"name": "per-key", "limit_keys": ["header:x-api-key"], "missing_key": "skip",
	  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 1}}]}`)
	s := newStream()
	r := w.p.NewRequest(s)
	for i, tc := range []struct {
		req       []string
		status    int
		remaining string // "": no RateLimit header
	}{
		{[]string{"x-api-key", "a"}, 200, "0"},
		{nil, 200, ""},                         // no rule applies: no header
		{[]string{"x-api-key", "b"}, 200, "0"}, // its own bucket
		{[]string{"x-api-key", "a"}, 429, ""},
	} {
		fresh := newStream(tc.req...)
		*s = *fresh // the host's same stream, another request
		a := r.OnRequestHeaders()
		status := 200
		if s.Replied != 0 {
			status = s.Replied
		} else if a != engine.Continue {
			t.Fatalf("request %d: action %v", i, a)
		}
		if status == 200 {
			s.Resp = map[string]string{":status": "200"}
			r.OnResponseHeaders(true)
		}
		got := header(s.Added, "ratelimit-remaining")
		if status != tc.status || status == 200 && got != tc.remaining || status == 200 && tc.remaining == "" && len(s.Added) != 0 {
			t.Fatalf("request %d: %d, remaining %q (added %v); want %d, %q", i, status, got, s.Added, tc.status, tc.remaining)
		}
		r.Done()
	}
}
