// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// side is one service of a differential with the Envoy in front of it.
type side struct {
	f     flavour
	s     *service
	e     *envoytest.Envoy
	c     *envoytest.Client
	label string
}

// startSides starts each flavour's service on its own redis-server with
// files, and an Envoy with rl in front of each: the same configuration on
// every side.
func startSides(t *testing.T, files map[string]string, rl envoy.RateLimit, fs ...flavour) []*side {
	t.Helper()
	var sides []*side
	for _, f := range fs {
		s := startService(t, f.kind, files, f.args...)
		e := startEnvoy(t, s, rl)
		c := e.Client()
		t.Cleanup(c.Close)
		sides = append(sides, &side{f: f, s: s, e: e, c: c, label: f.name})
	}
	return sides
}

func redisesOf(sides []*side) []*redistest.Server {
	var rs []*redistest.Server
	for _, sd := range sides {
		rs = append(rs, sd.s.redis)
	}
	return rs
}

// lockstep plays steps on every side, each request sent to every side in
// turn before the next: the sides see the same traffic at nearly the same
// moments. It returns what each side got, step by step. The steps marked
// second are started at the start of a second; oneSecond says whether they
// all ended within it (else a per-second window turned among them).
func lockstep(sides []*side, steps []step) (out [][][]seen, oneSecond bool) {
	out = make([][][]seen, len(sides))
	for i := range sides {
		out[i] = make([][]seen, len(steps))
	}
	oneSecond = true
	var second time.Time
	for j, st := range steps {
		if st.second && second.IsZero() {
			time.Sleep(untilEdge(time.Now(), time.Second) + 10*time.Millisecond)
			second = time.Now().Truncate(time.Second)
		}
		for range st.want {
			for i, sd := range sides {
				out[i][j] = append(out[i][j], seenOf(sd.c.Get("/", st.headers)))
			}
		}
		if st.second && !time.Now().Truncate(time.Second).Equal(second) {
			oneSecond = false
		}
	}
	return out, oneSecond
}

// sameAnswer reports whether two requests got the same status and
// x-ratelimit-* headers, x-ratelimit-reset within a second (the sides are
// asked a moment apart, and the seconds it counts are rounded).
func sameAnswer(a, b seen) bool {
	if a.Status != b.Status || a.Limit != b.Limit || a.Remaining != b.Remaining {
		return false
	}
	if a.Reset == b.Reset {
		return true
	}
	ra, ea := strconv.Atoi(a.Reset)
	rb, eb := strconv.Atoi(b.Reset)
	return ea == nil && eb == nil && ra-rb <= 1 && rb-ra <= 1
}

// windowScripts are scripts of one window each, for fixed windows: the
// hour scripts of the black-box tests, and short windows whose edges the
// play is aligned to.
func minuteScript() []step {
	return []step{
		{note: "10 a minute", headers: map[string]string{"x-m": "a"}, want: statuses(10, 2)},
		{note: "5 a second", headers: map[string]string{"x-s": "a"}, want: statuses(5, 2), second: true},
		{note: "both at once: the second's is over", headers: map[string]string{"x-m": "b", "x-s": "a"}, want: statuses(0, 2), second: true},
		{note: "the minute's key b counted the refused requests", headers: map[string]string{"x-m": "b"}, want: statuses(8, 1)},
	}
}

// statuses is ok 200s then over 429s.
func statuses(ok, over int) []int {
	var s []int
	for range ok {
		s = append(s, 200)
	}
	for range over {
		s = append(s, 429)
	}
	return s
}

const windowsYAML = `domain: windows
descriptors:
  - key: m
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: s
    rate_limit: {unit: second, requests_per_unit: 5}
`

var windowsRateLimits = envoy.RateLimitsYAML(
	envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-m", "m")}},
	envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-s", "s")}},
)

// TestDifferentialFixedWindow plays the same scripts through the same
// Envoy configuration in front of envoyproxy/ratelimit and of limitd
// --rls-algorithm fixed_window, each on its own redis-server, request by
// request: every request gets the same status and x-ratelimit-* headers on
// both, and the two Redis servers end up holding the same counters under
// the same names with the same values.
func TestDifferentialFixedWindow(t *testing.T) {
	t.Parallel()
	pair := []flavour{flavours[0], flavours[1]}
	scripts := []struct {
		name  string
		files map[string]string
		rl    envoy.RateLimit
		steps []step
		// unit: the play's window, played again when an edge of it fell
		// inside.
		unit time.Duration
	}{
		{name: "kinds", files: map[string]string{"kinds.yaml": kindsYAML},
			rl: envoy.RateLimit{Domain: "kinds", FailureModeDeny: true, RouteRateLimits: kindsRateLimits}, steps: kindsScript, unit: time.Hour},
		{name: "windows", files: map[string]string{"windows.yaml": windowsYAML},
			rl:    envoy.RateLimit{Domain: "windows", FailureModeDeny: true, RouteRateLimits: windowsRateLimits},
			steps: minuteScript(), unit: time.Minute},
	}
	for _, sc := range scripts {
		t.Run(sc.name, func(t *testing.T) {
			sides := startSides(t, sc.files, sc.rl, pair...)
			var got [][][]seen
			inWindowOf(t, redisesOf(sides), sc.unit, func() bool {
				var oneSecond bool // the per-second steps took at most a second
				got, oneSecond = lockstep(sides, sc.steps)
				return oneSecond
			})
			for i := range sides {
				checkStatuses(t, sides[i].f, sc.steps, got[i])
			}
			differ := 0
			for j, st := range sc.steps {
				for k := range got[0][j] {
					if a, b := got[0][j][k], got[1][j][k]; !sameAnswer(a, b) {
						differ++
						t.Errorf("step %d (%s) request %d: %s %v, %s %v", j, st.note, k, sides[0].label, a, sides[1].label, b)
					}
				}
			}
			if sc.name == "windows" {
				// The second's counters may have expired; the minute's hold.
				compareRedis(t, sides, "windows_m_")
			} else {
				compareRedis(t, sides, "kinds_")
			}
			t.Logf("%d requests on each side, %d answered differently", countRequests(sc.steps), differ)
		})
	}
}

func countRequests(steps []step) int {
	n := 0
	for _, st := range steps {
		n += len(st.want)
	}
	return n
}

// compareRedis compares the counters whose names start with prefix on
// every side's Redis: the same names, the same values.
func compareRedis(t *testing.T, sides []*side, prefix string) {
	t.Helper()
	var dumps []string
	for _, sd := range sides {
		keys, err := redistest.Do(sd.s.redis.Addr(), "KEYS", prefix+"*")
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for _, k := range strings.Split(keys, "\n") {
			if k == "" {
				continue
			}
			v, err := redistest.Do(sd.s.redis.Addr(), "GET", k)
			if err != nil {
				t.Fatalf("%s: GET %s: %v", sd.label, k, err)
			}
			lines = append(lines, k+" = "+v)
		}
		slices.Sort(lines)
		dumps = append(dumps, strings.Join(lines, "\n"))
	}
	if dumps[0] == "" {
		t.Errorf("%s's Redis holds no counter named %s*", sides[0].label, prefix)
	}
	for i := 1; i < len(dumps); i++ {
		if dumps[i] != dumps[0] {
			t.Errorf("Redis counters %s*:\n%s:\n%s\n%s:\n%s", prefix, sides[0].label, dumps[0], sides[i].label, dumps[i])
		}
	}
}

// TestDifferentialTokenBucket plays the same scripts on envoyproxy/ratelimit
// and on limitd's token buckets and records where they differ and why:
//
//   - A request one descriptor refuses: a fixed window still counts it on
//     the request's other descriptors; limitd's buckets give nothing
//     (the nested step of kindsScript).
//   - x-ratelimit-reset: the seconds to the window's end there, to a full
//     bucket here.
//   - A burst straight across a window's edge: the fixed window admits up
//     to twice the limit in a moment, the token bucket the limit plus what
//     refilled, which is asserted.
func TestDifferentialTokenBucket(t *testing.T) {
	t.Parallel()
	t.Run("kinds", func(t *testing.T) {
		sides := startSides(t, map[string]string{"kinds.yaml": kindsYAML},
			envoy.RateLimit{Domain: "kinds", FailureModeDeny: true, RouteRateLimits: kindsRateLimits}, flavours[0], flavours[2])
		var got [][][]seen
		inOneWindow(t, redisesOf(sides), func() { got, _ = lockstep(sides, kindsScript) })
		for i := range sides {
			checkStatuses(t, sides[i].f, kindsScript, got[i])
		}
		var statusDiff, remainingDiff, resetDiff int
		for j, st := range kindsScript {
			for k := range got[0][j] {
				a, b := got[0][j][k], got[1][j][k]
				switch {
				case a.Status != b.Status:
					statusDiff++
					t.Logf("differ: step %d (%s) request %d: %s %v, %s %v", j, st.note, k, sides[0].label, a, sides[1].label, b)
					if st.atomic == nil {
						t.Errorf("step %d (%s): statuses differ where the script expects none", j, st.note)
					}
				case policies(a.Limit) != policies(b.Limit):
					t.Errorf("step %d (%s) request %d: x-ratelimit-limit %q and %q: want the same limits matched", j, st.note, k, a.Limit, b.Limit)
				case a.Limit != b.Limit || a.Remaining != b.Remaining:
					// Envoy reports the descriptor closest to its limit;
					// which one that is follows the counts.
					remainingDiff++
					t.Logf("differ: step %d (%s) request %d: %s %v, %s %v", j, st.note, k, sides[0].label, a, sides[1].label, b)
				case !sameAnswer(a, b):
					resetDiff++
				}
			}
		}
		t.Logf("%d requests on each side: %d statuses differ (a refused request counted on the other descriptors, or not), %d closest limits or remaining counts (following those counts), %d resets (window end against full bucket)",
			countRequests(kindsScript), statusDiff, remainingDiff, resetDiff)
	})
	t.Run("across-an-edge", func(t *testing.T) {
		const yaml = `domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 10}
`
		sides := startSides(t, map[string]string{"edge.yaml": yaml}, envoy.RateLimit{Domain: "edge", FailureModeDeny: true,
			RouteRateLimits: envoy.RateLimitsYAML(envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-api-key", "api_key")}})},
			flavours[0], flavours[1], flavours[2])
		for attempt := 1; ; attempt++ {
			key := "k" + strconv.Itoa(attempt)
			// The first burst in the last half of a second, the second
			// right after its edge.
			if left := untilEdge(time.Now(), time.Second); left < 500*time.Millisecond {
				time.Sleep(left)
			}
			time.Sleep(untilEdge(time.Now(), time.Second) - 400*time.Millisecond)
			edge := time.Now().Truncate(time.Second).Add(time.Second)
			start := time.Now()
			first := burstAll(sides, key, 10)
			beforeEdge := time.Now().Before(edge)
			time.Sleep(time.Until(edge) + 20*time.Millisecond)
			second := burstAll(sides, key, 10)
			elapsed := time.Since(start)
			inNext := time.Now().Before(edge.Add(time.Second))
			if (!beforeEdge || !inNext) && attempt < 5 {
				t.Logf("attempt %d: the first burst ended after the edge or the second after the next one (machine busy): again", attempt)
				continue
			}
			for i, sd := range sides {
				a1, a2 := envoytest.Statuses(first[i])[200], envoytest.Statuses(second[i])[200]
				total := a1 + a2
				t.Logf("%s: %d + %d admitted of 10 + 10 across an edge within %v", sd.label, a1, a2, elapsed.Round(time.Millisecond))
				if sd.f.window {
					// Each burst had a window of its own: 10 each.
					if beforeEdge && inNext && (a1 != 10 || a2 != 10) {
						t.Errorf("%s: %d + %d admitted, want 10 + 10: a fixed window starts afresh at its edge", sd.label, a1, a2)
					}
					continue
				}
				// The bucket: 10, plus what refilled at 10 a second while
				// the bursts lasted.
				if bound := 10 + int(elapsed.Seconds()*10); a1 != 10 || total > bound {
					t.Errorf("%s: %d + %d admitted in %v, want 10 first and at most %d in all (the limit plus the refill)", sd.label, a1, a2, elapsed, bound)
				}
			}
			return
		}
	})
}

// burstAll sends n requests at once on key through every side's Envoy, all
// sides together, and returns each side's results.
func burstAll(sides []*side, key string, n int) [][]envoytest.Result {
	out := make([][]envoytest.Result, len(sides))
	var wg sync.WaitGroup
	for i, sd := range sides {
		wg.Go(func() {
			out[i] = sd.c.Burst(n, func(int) *http.Request {
				return sd.c.NewRequest("GET", "/", map[string]string{"x-api-key": key})
			})
		})
	}
	wg.Wait()
	return out
}

// policies is the quota policies of an x-ratelimit-limit value, after its
// first number: "5, 5;w=3600, 2;w=3600" → "5;w=3600, 2;w=3600".
func policies(limit string) string {
	_, p, _ := strings.Cut(limit, ", ")
	return p
}
