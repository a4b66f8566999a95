// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

const threeAnHour = `domain: hostile
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 3}
`

// TestInvalidUTF8Value sends, through Envoy's own filter with its default
// failure_mode_deny false, a key whose bytes are not UTF-8: limitd decides
// it like any other key (3 of 6 admitted on a limit of 3 an hour), where a
// failed call would admit all 6. Another such key is a key of its own.
func TestInvalidUTF8Value(t *testing.T) {
	for _, f := range flavours[1:] {
		t.Run(f.name, func(t *testing.T) {
			s := startService(t, f.kind, map[string]string{"hostile.yaml": threeAnHour}, f.args...)
			e := startEnvoy(t, s, envoy.RateLimit{Domain: "hostile",
				RouteRateLimits: envoy.RateLimitsYAML(envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-api-key", "api_key")}})})
			if f.window {
				alignWindow(t, time.Hour, 5*time.Minute)
			}
			c := e.Client()
			defer c.Close()
			var got []int
			for range 6 {
				got = append(got, c.Get("/", map[string]string{"x-api-key": "\xff\xfe"}).Status)
			}
			if want := []int{200, 200, 200, 429, 429, 429}; !equalInts(got, want) {
				t.Errorf("a key not UTF-8: %v, want %v", got, want)
			}
			if g := c.Get("/", map[string]string{"x-api-key": "\xfe\xff"}); g.Status != 200 {
				t.Errorf("another key not UTF-8: %d, want 200 (a key of its own)", g.Status)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
