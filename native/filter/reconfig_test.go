package filter

import (
	"testing"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"
)

// remaining runs one request of x-user user through c and returns its
// RateLimit-Remaining (the request must not be rejected: the fake handle
// cannot send a local reply).
func remaining(t *testing.T, c *filterConfig, user string) string {
	t.Helper()
	h := &filterHandle{req: newHeaders(map[string][]string{"x-user": {user}}), resp: newHeaders(nil)}
	f := c.Create(h).(*httpFilter)
	if st := f.OnRequestHeaders(h.req, true); st != shared.HeadersStatusContinue {
		t.Fatalf("OnRequestHeaders = %d, want Continue", st)
	}
	f.OnResponseHeaders(h.resp, true)
	f.OnStreamComplete()
	f.OnDestroy()
	return h.resp.GetOne("ratelimit-remaining").ToString()
}

// TestReconfigureKeepsBuckets: a new configuration (Envoy's listener
// update) finds the buckets of its unchanged rules where the previous one
// left them, as Wasm's shared data keeps them across configurations.
func TestReconfigureKeepsBuckets(t *testing.T) {
	const v1 = `{"rules": [
 {"name": "keep", "limit_keys": ["header:x-user"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
 {"name": "other", "match": {"path": {"prefix": "/other"}}, "limit_keys": ["header:x-user"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}}]}`
	const v2 = `{"rules": [
 {"name": "marker", "match": {"path": {"prefix": "/marker"}}, "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1000, "burst": 1000}},
 {"name": "keep", "limit_keys": ["header:x-user"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}}]}`
	_, c1 := newConfig(t, v1)
	for i, want := range []string{"2", "1"} {
		if got := remaining(t, c1, "reconf-u1"); got != want {
			t.Fatalf("v1 request %d: remaining %q, want %q", i, got, want)
		}
	}
	if got := remaining(t, c1, "reconf-u2"); got != "2" { // another bucket: the table's scratch key changes
		t.Fatalf("v1, another user: remaining %q, want \"2\"", got)
	}
	c1.OnDestroy()
	_, c2 := newConfig(t, v2)
	if got := remaining(t, c2, "reconf-u1"); got != "0" {
		t.Fatalf("after the new configuration: remaining %q, want \"0\" (the bucket of an unchanged rule continues)", got)
	}
}
