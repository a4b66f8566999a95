package rlqs

import (
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// The first report of a bucket gets its assignment at once, from the YAML's
// limits: a token bucket whose every admission over its life fits in the
// limit's burst; an unlimited or shadow limit, ALLOW_ALL; a limit of 0 or a
// fixed window, DENY_ALL; an unmatched or ambiguous bucket_id, the
// Unmatched default.
func TestAssignmentFromConfig(t *testing.T) {
	for _, un := range []Unmatched{AllowUnmatched, DenyUnmatched} {
		f := start(t, quotaYAML, fixtureOpts{unmatched: un})
		s, _ := f.open("")
		r := exchange(t, s, "quota", usage(map[string]string{"api_key": "a"}, 0, 1, 0))
		if len(r.BucketAction) != 1 {
			t.Fatalf("want one action, got %v", r)
		}
		tb, ttl := tokenBucket(t, r.BucketAction[0])
		rate := float64(tb.TokensPerFill.GetValue()) / tb.FillInterval.AsDuration().Seconds()
		if tb.MaxTokens < 1 || tb.MaxTokens > 40 || rate > 40.0/60 || ttl < DefaultTTL {
			t.Fatalf("assignment %v ttl %v: want max_tokens 1..40, a rate up to 40 a minute, a TTL of at least %v", tb, ttl, DefaultTTL)
		}
		t.Logf("first assignment: max_tokens %d, %d per %v, ttl %v", tb.MaxTokens, tb.TokensPerFill.GetValue(), tb.FillInterval.AsDuration(), ttl)
		want := typev3.RateLimitStrategy_ALLOW_ALL
		if un == DenyUnmatched {
			want = typev3.RateLimitStrategy_DENY_ALL
		}
		for _, c := range []struct {
			id   map[string]string
			want typev3.RateLimitStrategy_BlanketRule
		}{
			{map[string]string{"free": "x"}, typev3.RateLimitStrategy_ALLOW_ALL},
			{map[string]string{"blocked": "x"}, typev3.RateLimitStrategy_DENY_ALL},
			{map[string]string{"counted": "x"}, typev3.RateLimitStrategy_DENY_ALL},
			{map[string]string{"watched": "x"}, typev3.RateLimitStrategy_ALLOW_ALL},
			{map[string]string{"nothing": "x"}, want},
			{map[string]string{"api_key": "a", "extra": "x"}, want}, // a key left over
			{map[string]string{"tenant": "t", "other": "o"}, want},  // ambiguous
		} {
			r := exchange(t, s, "quota", usage(c.id, 0, 1, 0))
			if got := blanket(t, r.BucketAction[0]); got != c.want {
				t.Errorf("%v: got %v, want %v", c.id, got, c.want)
			}
		}
		r = exchange(t, s, "quota", usage(map[string]string{"path": "/p", "tenant": "t"}, 0, 1, 0))
		tokenBucket(t, r.BucketAction[0])
	}
}

// Envoy 1.40 compares fill_interval by its nanos only: a new shape that
// differs from the one in force only in its whole seconds would leave Envoy
// on the old rate. Every shape sent differs where Envoy looks, at no more
// than the rate and the tokens chosen.
func TestShapeSeenByEnvoy(t *testing.T) {
	old := shape{max: 5, perFill: 1, fill: 3}
	for _, c := range []shape{{max: 5, perFill: 1, fill: 6}, {max: 1, perFill: 1, fill: 2}, {max: 5, perFill: 1, fill: 3}} {
		if c.max == 1 {
			old = shape{max: 1, perFill: 1, fill: 9}
		}
		g := &grant{last: old, commits: []commit{{sh: old, end: epoch.Add(time.Minute)}}}
		l := &ledger{grants: map[Holder]*grant{{}: g}}
		got := l.distinct(c, g)
		if got == c && c != old && got.max == old.max && got.perFill == old.perFill {
			t.Errorf("distinct(%+v, %+v) = %+v: Envoy sees it as the old one", c, old, got)
		}
		if got.max > 0 && (got.max == old.max && got.perFill == old.perFill) && got != old {
			t.Errorf("distinct(%+v, %+v) = %+v: Envoy would keep the old rate", c, old, got)
		}
		if got.rate() > c.rate()+1e-9 || got.most(time.Minute) > c.most(time.Minute)+1e-9 {
			t.Errorf("distinct(%+v, %+v) = %+v: more than chosen", c, old, got)
		}
	}
}
