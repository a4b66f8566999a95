// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// TestRedisStopped kills the service's redis-server: the service answers
// Envoy with an error, and Envoy's failure_mode_deny decides: 500 when
// true, the request passes when false. With Redis back (empty), decisions
// come back.
func TestRedisStopped(t *testing.T) {
	t.Parallel()
	const yaml = `domain: store
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 100}
`
	rls := envoy.RateLimitsYAML(envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-api-key", "api_key")}})
	for _, f := range flavours {
		t.Run(f.name, func(t *testing.T) {
			s := startService(t, f.kind, map[string]string{"store.yaml": yaml}, f.args...)
			deny := startEnvoy(t, s, envoy.RateLimit{Domain: "store", FailureModeDeny: true, RouteRateLimits: rls})
			allow := startEnvoy(t, s, envoy.RateLimit{Domain: "store", FailureModeDeny: false, RouteRateLimits: rls})
			dc, ac := deny.Client(), allow.Client()
			defer dc.Close()
			defer ac.Close()
			h := map[string]string{"x-api-key": "k"}
			for _, c := range []*envoytest.Client{dc, ac} {
				if r := c.Get("/", h); r.Status != 200 || r.Header.Get("x-ratelimit-limit") == "" {
					t.Fatalf("with Redis up: %v%s, want 200 with x-ratelimit-* headers", r, rlHeaders(r))
				}
			}
			s.redis.Kill()
			// A few requests each: a pool may notice the dead connection
			// on the first.
			for i := range 3 {
				if r := dc.Get("/", h); r.Status != 500 {
					t.Errorf("Redis down, failure_mode_deny true, request %d: %v%s, want 500", i, r, rlHeaders(r))
				}
				if r := ac.Get("/", h); r.Status != 200 || r.Header.Get("x-ratelimit-limit") != "" {
					t.Errorf("Redis down, failure_mode_deny false, request %d: %v%s, want 200 without x-ratelimit-* headers", i, r, rlHeaders(r))
				}
			}
			if n := deny.Stat("cluster.upstream.ratelimit.error"); n == 0 {
				t.Errorf("Envoy counted no rate limit service error (cluster.upstream.ratelimit.error = 0)")
			}
			if n := allow.Stat("cluster.upstream.ratelimit.failure_mode_allowed"); n == 0 {
				t.Errorf("Envoy counted no request let through (cluster.upstream.ratelimit.failure_mode_allowed = 0)")
			}
			if err := s.redis.Restart(); err != nil {
				t.Fatal(err)
			}
			var last envoytest.Result
			for deadline := time.Now().Add(waitTimeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				if last = dc.Get("/", h); last.Status == 200 {
					break
				}
			}
			if last.Status != 200 || last.Header.Get("x-ratelimit-limit") != "100, 100;w=3600" {
				t.Errorf("Redis back: %v%s, want 200 with the limit's headers within %v", last, rlHeaders(last), waitTimeout)
			}
		})
	}
}
