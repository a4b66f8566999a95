// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

// calendarYAML is limitd's calendar extension: 3 an hour per tenant, the
// hours of Asia/Kathmandu (UTC+5:45), which turn at hh:15 UTC.
const calendarYAML = `domain: cal
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 3
      calendar: {time_zone: Asia/Kathmandu}
`

// untilKathmanduHour is the time from now to the next hh:15 UTC.
func untilKathmanduHour(now time.Time) time.Duration {
	const phase = 15 * time.Minute
	return now.Add(-phase).Truncate(time.Hour).Add(time.Hour + phase).Sub(now)
}

// TestCalendarHour: through Envoy's own rate limit filter, a calendar hour
// in Asia/Kathmandu admits 3 and refuses the 4th, and Envoy's
// x-ratelimit-reset (from duration_until_reset) counts the seconds to the
// next hh:15 UTC, not to the next hh:00 as a fixed window of an hour would.
func TestCalendarHour(t *testing.T) {
	t.Parallel()
	if left := untilKathmanduHour(time.Now()); left < 30*time.Second {
		time.Sleep(left + time.Second) // one period for the whole exchange
	}
	s := startService(t, limitd, map[string]string{"cal.yaml": calendarYAML})
	e := startEnvoy(t, s, envoy.RateLimit{Domain: "cal", FailureModeDeny: true, RouteRateLimits: envoy.RateLimitsYAML(
		envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-tenant", "tenant")}})})
	c := e.Client()
	defer c.Close()
	for i := range 4 {
		before := untilKathmanduHour(time.Now())
		g := seenOf(c.Get("/", map[string]string{"x-tenant": "a"}))
		after := untilKathmanduHour(time.Now())
		if want := map[bool]int{true: 200, false: 429}[i < 3]; g.Status != want || g.Limit == "" {
			t.Fatalf("request %d: %v, want %d with the limit's headers", i, g, want)
		}
		reset, err := strconv.ParseInt(g.Reset, 10, 64)
		lo, hi := int64(after.Seconds())-1, int64(before.Seconds())+2
		if err != nil || reset < lo || reset > hi {
			t.Fatalf("request %d: x-ratelimit-reset %q, want %d to %d s (to the next hh:15 UTC)", i, g.Reset, lo, hi)
		}
	}
}
