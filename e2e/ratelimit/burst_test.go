// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// flavour is one way of deciding: envoyproxy/ratelimit, or limitd with its
// token buckets or its fixed windows.
type flavour struct {
	name string
	kind kind
	args []string
	// window: fixed windows (envoyproxy/ratelimit's way), else token buckets.
	window bool
}

var flavours = []flavour{
	{name: "envoyproxy-ratelimit", kind: reference, window: true},
	{name: "limitd-fixed-window", kind: limitd, args: []string{"--rls-algorithm", "fixed_window"}, window: true},
	{name: "limitd-token-bucket", kind: limitd},
}

const fortyAMinute = `domain: burst
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 40}
`

// TestBurstTwoEnvoys sends 300 requests at once on one key of 40 a minute,
// through two Envoys of two workers each whose own rate limit filter asks
// one service: exactly 40 pass. The x-ratelimit-* headers Envoy writes
// from the service's answers are checked against what happened: every
// admitted request saw the limit, a remaining count below it and, for
// fixed windows, a count of its own (0..39, each once) and the seconds to
// the window's end.
func TestBurstTwoEnvoys(t *testing.T) {
	t.Parallel()
	for _, f := range flavours {
		t.Run(f.name, func(t *testing.T) {
			s := startService(t, f.kind, map[string]string{"burst.yaml": fortyAMinute}, f.args...)
			rl := envoy.RateLimit{Domain: "burst", FailureModeDeny: true,
				RouteRateLimits: envoy.RateLimitsYAML(envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-api-key", "api_key")}})}
			envoys := []*envoytest.Envoy{startEnvoy(t, s, rl), startEnvoy(t, s, rl)}
			var start time.Time
			var elapsed time.Duration
			results := make([][]envoytest.Result, len(envoys))
			burst := func() bool {
				start = time.Now()
				var wg sync.WaitGroup
				for i, e := range envoys {
					wg.Go(func() {
						c := e.Client()
						defer c.Close()
						results[i] = c.Burst(150, func(int) *http.Request {
							return c.NewRequest("GET", "/", map[string]string{"x-api-key": "shared"})
						})
					})
				}
				wg.Wait()
				elapsed = time.Since(start)
				return true
			}
			playFor(t, f, s, time.Minute, burst) // one window for the whole burst
			var all []envoytest.Result
			for _, r := range results {
				all = append(all, r...)
			}
			statuses := envoytest.Statuses(all)
			admitted := statuses[200]
			if statuses[200]+statuses[429] != 300 {
				t.Fatalf("statuses %v: want only 200 and 429", statuses)
			}
			if f.window {
				if admitted != 40 {
					t.Errorf("admitted %d of 300 in one window of 40 a minute, want 40 (statuses %v)", admitted, statuses)
				}
			} else {
				// A bucket of 40 refilled at 40/60 a second: 40, plus what
				// refilled while the burst lasted (nothing under 1.5 s).
				bound := 40 + int(elapsed.Seconds()*40/60)
				if admitted < 40 || admitted > bound {
					t.Errorf("admitted %d of 300 in %v on a bucket of 40 a minute, want 40..%d", admitted, elapsed, bound)
				}
				t.Logf("admitted %d of 300 in %v", admitted, elapsed)
			}
			seen := map[int]int{}
			for _, r := range all {
				if got := r.Header.Get("x-ratelimit-limit"); got != "40, 40;w=60" {
					t.Errorf("%d: x-ratelimit-limit %q, want \"40, 40;w=60\" (%s)", r.Status, got, rlHeaders(r))
					continue
				}
				remaining, err := strconv.Atoi(r.Header.Get("x-ratelimit-remaining"))
				if err != nil || remaining < 0 || remaining >= 40 || (r.Status == 429 && remaining != 0) {
					t.Errorf("%d: x-ratelimit-remaining %q: want 0..39, 0 when refused", r.Status, r.Header.Get("x-ratelimit-remaining"))
				}
				if r.Status == 200 {
					seen[remaining]++
				}
				reset, err := strconv.Atoi(r.Header.Get("x-ratelimit-reset"))
				if err != nil || reset < 0 || reset > 60 {
					t.Errorf("%d: x-ratelimit-reset %q: want 0..60 seconds", r.Status, r.Header.Get("x-ratelimit-reset"))
				}
				if f.window && r.Status == 429 {
					if edge := untilEdge(start, time.Minute).Seconds(); float64(reset) > edge+1 || float64(reset) < edge-elapsed.Seconds()-1 {
						t.Errorf("429: x-ratelimit-reset %d s, the window ends %.1f s after the burst began", reset, edge)
					}
				}
				if r.Status == 429 && r.Header.Get("x-envoy-ratelimited") != "true" {
					t.Errorf("429 without x-envoy-ratelimited: %s", rlHeaders(r))
				}
			}
			if f.window {
				for n := range 40 {
					if seen[n] != 1 {
						t.Errorf("x-ratelimit-remaining %d seen by %d admitted requests, want 1 (a count each)", n, seen[n])
					}
				}
			}
		})
	}
}
