// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// extensionsYAML uses limitd's two extensions: a burst apart from the rate,
// and an algorithm per limit against the service's default.
const extensionsYAML = `domain: ext
descriptors:
  - key: burst
    rate_limit: {unit: hour, requests_per_unit: 600, burst: 5, algorithm: token_bucket}
  - key: window
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: fixed_window}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: token_bucket}
`

// TestExtensions runs limitd's extensions through Envoy's own filter, on
// either default algorithm: a bucket of 600 an hour with a burst of 5
// admits 5 at once (plus one every 6 s), x-ratelimit-remaining counting
// the burst's tokens, and a limit's own algorithm wins over
// --rls-algorithm (its Redis key is a window's counter or a bucket).
// envoyproxy/ratelimit refuses the file, naming the field.
func TestExtensions(t *testing.T) {
	t.Parallel()
	ref := startService(t, reference, map[string]string{"ext.yaml": extensionsYAML})
	if errs := ref.rl.ConfigErrors(); len(errs) == 0 || !strings.Contains(errs[0], "burst") && !strings.Contains(errs[0], "algorithm") {
		t.Errorf("envoyproxy/ratelimit: refusals %q, want one naming an extension", errs)
	}
	for _, f := range flavours[1:] {
		t.Run(f.name, func(t *testing.T) {
			s := startService(t, f.kind, map[string]string{"ext.yaml": extensionsYAML}, f.args...)
			e := startEnvoy(t, s, envoy.RateLimit{Domain: "ext", FailureModeDeny: true, RouteRateLimits: envoy.RateLimitsYAML(
				envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-burst", "burst")}},
				envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-window", "window")}},
				envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-bucket", "bucket")}},
			)})
			c := e.Client()
			defer c.Close()
			start := time.Now()
			var got []seen
			for range 8 {
				got = append(got, seenOf(c.Get("/", map[string]string{"x-burst": "k"})))
			}
			elapsed := time.Since(start)
			admitted := 0
			for _, g := range got {
				if g.Status == 200 {
					admitted++
				}
				if r, err := strconv.Atoi(g.Remaining); err != nil || r < 0 || r >= 5 {
					t.Errorf("burst: %v, want 0..4 remaining of a burst of 5", g)
				}
			}
			if bound := 5 + int(elapsed.Seconds()/6); admitted < 5 || admitted > bound {
				t.Errorf("burst of 5 at 600 an hour: %d of 8 admitted in %v, want 5..%d\n%v", admitted, elapsed, bound, got)
			}
			for _, h := range []string{"x-window", "x-bucket"} {
				if g := seenOf(c.Get("/", map[string]string{h: "k"})); g.Status != 200 || g.Remaining != "2" {
					t.Errorf("%s: %v, want 200 with 2 of 3 left", h, g)
				}
			}
			keys, err := redistest.Do(s.redis.Addr(), "KEYS", "*")
			if err != nil {
				t.Fatal(err)
			}
			var window, bucket bool
			for _, k := range strings.Split(keys, "\n") {
				window = window || strings.HasPrefix(k, "ext_window_k_")
				bucket = bucket || strings.HasPrefix(k, "rl:") && strings.HasSuffix(k, ":3:ext_6:bucket_1:k")
			}
			if !window || !bucket {
				t.Errorf("Redis keys %q: want a window's counter ext_window_k_<start> and a bucket rl:...:3:ext_6:bucket_1:k", keys)
			}
		})
	}
}
