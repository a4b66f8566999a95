package engine_test

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// sfInteger is an RFC 9651 Integer: what RateLimit-Policy's q and
// RateLimit-Limit hold. A parser refuses anything else, and the whole field
// with it.
var sfInteger = regexp.MustCompile(`^-?[0-9]{1,15}$`)

// TestWholeQuota: a fractional burst is shown rounded down in
// RateLimit-Policy's q and in RateLimit-Limit (the cost-1 requests a full
// bucket admits), never as a decimal; w stays the seconds to refill it.
func TestWholeQuota(t *testing.T) {
	for _, tc := range []struct {
		rate, burst string
		q, w        string
	}{
		{"3", "10", "10", "4"},
		{"1", "3.3333", "3", "4"},
		{"0.3", "3.3333333333333335", "3", "12"},
		{"0.25", "2.999", "2", "12"},
	} {
		t.Run("burst "+tc.burst, func(t *testing.T) {
			h := fakehost.New()
			p := newPlugin(t, h, `{"rules": [{"name": "r", "algorithm": "token_bucket",
			  "algorithm_config": {"tokens_per_second": `+tc.rate+`, "burst": `+tc.burst+`}}]}`)
			s := newStream()
			r := p.NewRequest(s)
			r.OnRequestHeaders()
			s.Resp[":status"] = "200"
			r.OnResponseHeaders(true)
			if got, want := header(s.Added, "ratelimit-policy"), `"r";q=`+tc.q+`;w=`+tc.w; got != want {
				t.Errorf("RateLimit-Policy %q, want %q", got, want)
			}
			limit := header(s.Added, "ratelimit-limit")
			if limit != tc.q || !sfInteger.MatchString(limit) {
				t.Errorf("RateLimit-Limit %q, want %q", limit, tc.q)
			}
			if _, err := strconv.ParseInt(header(s.Added, "ratelimit-remaining"), 10, 64); err != nil {
				t.Errorf("RateLimit-Remaining: %v", err)
			}
		})
	}
}
