package rls

import (
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimit-wasm/tokenbucket/service"
)

const calendarYAML = `domain: apis
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 3
      calendar: {time_zone: Asia/Kathmandu}
  - key: plan
    rate_limit:
      unit: quarter
      requests_per_unit: 2
      calendar: {time_zone: America/New_York}
`

// TestCalendarWindow: a calendar hour in Asia/Kathmandu (UTC+5:45) is
// counted from hh:15 UTC to the next, its duration_until_reset is the time
// to that boundary, and a new window counts from 0; a quarter in New York
// resets on the 1st of its next quarter at local midnight, and is named
// UNKNOWN in Envoy's enum.
func TestCalendarWindow(t *testing.T) {
	at := time.Date(2026, 3, 31, 14, 50, 30, 0, time.UTC) // 20:35:30 in Kathmandu; 10:50:30 EDT
	c := newClock(at)
	stores(t, c, func(t *testing.T, st service.Store) {
		c.t = at
		f := start(t, calendarYAML, fixtureOpts{store: st, now: c.Now})
		for i := range 4 {
			r := f.call(request("apis", desc("tenant", "a")))
			if want := i < 3; (r.OverallCode == ok) != want || r.Statuses[0].LimitRemaining != uint32(max(0, 2-i)) {
				t.Fatalf("call %d: %v, want ok %v", i, r, want)
			}
			if got, want := r.Statuses[0].GetDurationUntilReset().AsDuration(), 24*time.Minute+30*time.Second; i < 3 && got != want {
				t.Fatalf("call %d: reset in %v, want %v (to 15:15 UTC)", i, got, want)
			}
			if r.Statuses[0].CurrentLimit.Unit != pb.RateLimitResponse_RateLimit_HOUR {
				t.Fatalf("unit %v, want HOUR", r.Statuses[0].CurrentLimit.Unit)
			}
		}
		// 15:14:59 UTC: the same window; 15:15 UTC: a new one.
		c.t = time.Date(2026, 3, 31, 15, 14, 59, 0, time.UTC)
		if r := f.call(request("apis", desc("tenant", "a"))); r.OverallCode != over {
			t.Fatalf("15:14:59 UTC: %v, want over", codesOf(r))
		}
		c.t = time.Date(2026, 3, 31, 15, 15, 0, 0, time.UTC)
		r := f.call(request("apis", desc("tenant", "a")))
		if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 2 || r.Statuses[0].GetDurationUntilReset().AsDuration() != time.Hour {
			t.Fatalf("15:15 UTC: %v, want a new window, reset in 1h", r)
		}
		// The quarter: 2026-03-31 is its last day; it resets at midnight
		// EDT, 04:00 UTC on April 1st.
		c.t = at
		r = f.call(request("apis", desc("plan", "p")))
		if r.OverallCode != ok || r.Statuses[0].GetDurationUntilReset().AsDuration() != 13*time.Hour+9*time.Minute+30*time.Second ||
			r.Statuses[0].CurrentLimit.Unit != pb.RateLimitResponse_RateLimit_UNKNOWN {
			t.Fatalf("quarter: %v, want reset in 13h9m30s, unit UNKNOWN", r)
		}
	})
}
