package rls

import (
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// NEAR_LIMIT_RATIO's threshold is floor(float32(limit) × ratio): with 0.5
// the hits past 5 of a window of 10 are near the limit; with 0.29 of 100
// the hits past 29 (float32 rounds the product to 29, where float64's is
// 28.999999999999996, floored to 28).
func TestNearLimitRatio(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: k
    value: ten
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: k
    value: hundred
    rate_limit: {unit: hour, requests_per_unit: 100}
`
	for _, tc := range []struct {
		ratio             float32
		value             string
		calls             int
		wantNear, wantOut float64
	}{
		{0, "ten", 10, 2, 0},        // the default, 0.8
		{0.5, "ten", 10, 5, 0},      // 6..10
		{0.5, "ten", 12, 5, 2},      // and 2 over
		{0.29, "hundred", 30, 1, 0}, // the 30th only
	} {
		c := newClock(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
		f := start(t, yaml, fixtureOpts{store: memory(c), algo: rlsconfig.FixedWindow, now: c.Now,
			options: func(o *Options) { o.NearLimitRatio = tc.ratio }})
		for range tc.calls {
			f.call(request("d", desc("k", tc.value)))
		}
		l := map[string]string{"descriptor": "k_" + tc.value}
		if near, out := f.counter("limitd_rls_near_limit_total", l), f.counter("limitd_rls_over_limit_total", l); near != tc.wantNear || out != tc.wantOut {
			t.Errorf("ratio %v, %d calls of %s: near %v over %v, want %v %v", tc.ratio, tc.calls, tc.value, near, out, tc.wantNear, tc.wantOut)
		}
	}
	if _, err := NewServer(Options{Store: memory(newClock(time.Unix(0, 0))), Metrics: &Metrics{}, NearLimitRatio: 1.5}); err == nil {
		t.Error("NewServer accepted a near limit ratio of 1.5")
	}
}
