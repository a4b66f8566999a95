// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"fmt"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

const threeAnHour = `domain: hostile
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 1}
`

// TestInvalidUTF8Value sends, through Envoy's own filter with its default
// failure_mode_deny false, a key whose bytes are not UTF-8: limitd decides
// it like any other key (3 of 6 admitted on a limit of 3 an hour), where a
// failed call would admit all 6. Another such key is a key of its own.
func TestInvalidUTF8Value(t *testing.T) {
	t.Parallel()
	for _, f := range flavours[1:] {
		t.Run(f.name, func(t *testing.T) {
			s := startService(t, f.kind, map[string]string{"hostile.yaml": threeAnHour}, f.args...)
			e := startEnvoy(t, s, envoy.RateLimit{Domain: "hostile",
				RouteRateLimits: envoy.RateLimitsYAML(envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-api-key", "api_key")}})})
			c := e.Client()
			defer c.Close()
			var got []int
			var other int
			play := func() bool {
				got = got[:0]
				for range 6 {
					got = append(got, c.Get("/", map[string]string{"x-api-key": "\xff\xfe"}).Status)
				}
				other = c.Get("/", map[string]string{"x-api-key": "\xfe\xff"}).Status
				return true
			}
			playFor(t, f, s, time.Hour, play)
			if want := []int{200, 200, 200, 429, 429, 429}; !equalInts(got, want) {
				t.Errorf("a key not UTF-8: %v, want %v", got, want)
			}
			if other != 200 {
				t.Errorf("another key not UTF-8: %d, want 200 (a key of its own)", other)
			}
		})
	}
}

// TestHostileValues asks limitd directly over gRPC, as a client other than
// Envoy may: a value holding "_" does not drain another descriptor's token
// bucket, and a 60,000-byte value is stored under a bounded name (a hash
// past --max-key-bytes), with either algorithm.
func TestHostileValues(t *testing.T) {
	t.Parallel()
	for _, f := range flavours[1:] {
		t.Run(f.name, func(t *testing.T) {
			s := startService(t, f.kind, map[string]string{"hostile.yaml": threeAnHour}, f.args...)
			if !f.window {
				for i, d := range []entries{{"user", "victim_path_/x"}, {"user", "victim", "path", "/x"}} {
					if r, err := s.call("hostile", 1, d); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						t.Errorf("descriptor %d %v: %v, %v; want OK (a bucket of its own)", i, d, r.GetOverallCode(), err)
					}
				}
			}
			long := strings.Repeat("v", 60_000)
			var problems []string
			play := func() bool {
				problems = problems[:0]
				for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
					if r, err := s.call("hostile", 1, entries{"user", long}); err != nil || r.GetOverallCode() != want {
						problems = append(problems, fmt.Sprintf("a long value, call %d: %v, %v; want %v", i, r.GetOverallCode(), err, want))
					}
				}
				return true
			}
			playFor(t, f, s, time.Hour, play)
			if len(problems) > 0 {
				t.Fatal(strings.Join(problems, "\n"))
			}
			keys, err := redistest.Do(s.redis.Addr(), "KEYS", "*")
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range strings.Split(keys, "\n") {
				if len(k) > 600 {
					t.Errorf("a Redis key of %d bytes: %.80q...", len(k), k)
				}
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
