package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// quotaConfig: an hour quota in Asia/Kathmandu (UTC+5:45, so its hours turn
// at hh:15 UTC), minute quotas in UTC turning at second 0 (no anchor), 15,
// 30 and 45 (anchors), and a day quota in Pacific/Chatham counted across
// the workers, each per x-tenant.
const quotaConfig = `{"rules": [
 {"name": "kathmandu", "match": {"path": {"prefix": "/hour"}}, "limit_keys": ["header:x-tenant"],
  "algorithm": "quota", "algorithm_config": {"limit": 3, "period": "hour", "time_zone": "Asia/Kathmandu"}},
 {"name": "minute", "match": {"path": {"prefix": "/minute/0"}}, "limit_keys": ["header:x-tenant"],
  "algorithm": "quota", "status": 403, "algorithm_config": {"limit": 2, "period": "minute"}},
 {"name": "minute-15", "match": {"path": {"prefix": "/minute/15"}}, "limit_keys": ["header:x-tenant"],
  "algorithm": "quota", "status": 403, "algorithm_config": {"limit": 2, "period": "minute", "anchor": "2026-01-01T00:00:15"}},
 {"name": "minute-30", "match": {"path": {"prefix": "/minute/30"}}, "limit_keys": ["header:x-tenant"],
  "algorithm": "quota", "status": 403, "algorithm_config": {"limit": 2, "period": "minute", "anchor": "2026-01-01T00:00:30"}},
 {"name": "minute-45", "match": {"path": {"prefix": "/minute/45"}}, "limit_keys": ["header:x-tenant"],
  "algorithm": "quota", "status": 403, "algorithm_config": {"limit": 2, "period": "minute", "anchor": "2026-01-01T00:00:45"}},
 {"name": "daily", "match": {"path": {"prefix": "/day"}}, "limit_keys": ["header:x-tenant"],
  "algorithm": "quota", "algorithm_config": {"limit": 50, "period": "day", "time_zone": "Pacific/Chatham"}}]}`

// TestQuota: calendar quotas on Envoy with four workers, both builds.
func TestQuota(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testQuota)
}

// secondsTo is the whole seconds (rounded up) from at to the next boundary
// of a period of length p that starts at offset phase past UTC's.
func secondsTo(at time.Time, p, phase time.Duration) int64 {
	next := at.Add(-phase).Truncate(p).Add(p).Add(phase)
	return int64((next.Sub(at) + time.Second - 1) / time.Second)
}

// rateLimitT reads t from a RateLimit header "name";r=R;t=T.
func rateLimitT(t *testing.T, h string) int64 {
	t.Helper()
	_, v, ok := strings.Cut(h, ";t=")
	n, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil {
		t.Fatalf("RateLimit %q: no t", h)
	}
	return n
}

// within checks that got lies in what the clock read before and after the
// request (each rounded up to whole seconds), a second either side for the
// rounding of two clocks.
func within(t *testing.T, what string, got, before, after int64) {
	t.Helper()
	lo, hi := min(before, after), max(before, after)
	if got < lo-1 || got > hi+1 {
		t.Fatalf("%s = %d, want %d to %d", what, got, lo, hi)
	}
}

// awayFromBoundary waits, at most margin, until the next boundary of a
// period (length p, phase) is more than margin away, so a short exchange
// cannot straddle it.
func awayFromBoundary(p, phase, margin time.Duration) {
	if left := time.Duration(secondsTo(time.Now(), p, phase)) * time.Second; left <= margin {
		time.Sleep(left + time.Second)
	}
}

func testQuota(t *testing.T, build envoytest.Build) {
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
		PluginConfig: quotaConfig, UpstreamPort: up.Port(), Concurrency: 4})
	c := e.Client()
	t.Cleanup(c.Close)
	const kathmandu = 15 * time.Minute // hours turn at hh:15 UTC

	t.Run("an hour in Kathmandu ends at the next hh:15 UTC", func(t *testing.T) {
		awayFromBoundary(time.Hour, kathmandu, 30*time.Second)
		key := map[string]string{"x-tenant": "kathmandu-" + build.String()}
		for i := 0; i < 4; i++ {
			before := secondsTo(time.Now(), time.Hour, kathmandu)
			r := c.Do("GET", "/hour", key)
			after := secondsTo(time.Now(), time.Hour, kathmandu)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			if got := r.Header.Get("RateLimit-Policy"); got != `"kathmandu";q=3;w=3600` {
				t.Fatalf("request %d: RateLimit-Policy %q", i, got)
			}
			within(t, "t", rateLimitT(t, r.Header.Get("RateLimit")), before, after)
			if i < 3 {
				if r.Status != 200 || !strings.HasPrefix(r.Header.Get("RateLimit"), `"kathmandu";r=`+strconv.Itoa(2-i)+";") {
					t.Fatalf("request %d: %d, RateLimit %q, want 200 and r=%d", i, r.Status, r.Header.Get("RateLimit"), 2-i)
				}
				continue
			}
			// Past the limit: refused until the boundary, jittered upward by up to a half.
			ra, err := strconv.ParseInt(r.Header.Get("Retry-After"), 10, 64)
			if r.Status != 429 || err != nil || ra < min(before, after)-1 || ra > max(before, after)*3/2+1 {
				t.Fatalf("request %d: %d, Retry-After %q, want 429 and %d to %d", i, r.Status, r.Header.Get("Retry-After"), before, after*3/2)
			}
		}
	})

	t.Run("a minute resets at the wall-clock minute", func(t *testing.T) {
		// The minute whose boundary is 8 to 23 s away (of those turning at
		// second 0, 15, 30 and 45): long enough for the exchange, short to
		// wait out.
		phase := 0
		for p := 0; p < 60; p += 15 {
			if left := secondsTo(time.Now(), time.Minute, time.Duration(p)*time.Second); left >= 8 && left < 23 {
				phase = p
			}
		}
		path, offset := "/minute/"+strconv.Itoa(phase), time.Duration(phase)*time.Second
		awayFromBoundary(time.Minute, offset, 5*time.Second)
		key := map[string]string{"x-tenant": "minute-" + build.String()}
		var statuses []int
		var reset int64
		for i := 0; i < 3; i++ {
			before := secondsTo(time.Now(), time.Minute, offset)
			r := c.Do("GET", path, key)
			after := secondsTo(time.Now(), time.Minute, offset)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			statuses = append(statuses, r.Status)
			reset = rateLimitT(t, r.Header.Get("RateLimit"))
			within(t, "t", reset, before, after)
		}
		if want := []int{200, 200, 403}; !slicesEqual(statuses, want) {
			t.Fatalf("statuses %v, want %v (the rule answers 403)", statuses, want)
		}
		// Wait out the reset the answer gave (at most a minute), then the
		// quota is full again.
		if reset > 61 {
			t.Fatalf("t = %d: more than a minute", reset)
		}
		time.Sleep(time.Duration(reset)*time.Second + 500*time.Millisecond)
		r := c.Do("GET", path, key)
		if r.Err != nil || r.Status != 200 || !strings.Contains(r.Header.Get("RateLimit"), `";r=1;`) {
			t.Fatalf("after the boundary: %v, RateLimit %q, want 200 and r=1", r, r.Header.Get("RateLimit"))
		}
	})

	t.Run("exact across 4 workers: 200 at once, 50 admitted", func(t *testing.T) {
		chatham, err := time.LoadLocation("Pacific/Chatham")
		if err != nil {
			t.Fatal(err)
		}
		_, off := time.Now().In(chatham).Zone() // its days turn at 10:15 or 11:15 UTC
		awayFromBoundary(24*time.Hour, -time.Duration(off)*time.Second, 30*time.Second)
		key := "daily-" + build.String()
		res := c.Burst(200, func(int) *http.Request {
			return c.NewRequest("GET", "/day", map[string]string{"x-tenant": key})
		})
		if st := envoytest.Statuses(res); st[200] != 50 || st[429] != 150 {
			t.Fatalf("statuses %v, want exactly 50 admitted and 150 refused", st)
		}
	})
}
