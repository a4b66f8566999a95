package e2e

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// delayConfig holds requests short of tokens (max_delay_ms): a rule at 10 a
// second with burst 1 that holds up to one second, a slow one for a client
// that hangs up, and two stacked rules.
const delayConfig = `{"rules": [
 {"name": "smooth", "match": {"path": {"prefix": "/smooth"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}},
 {"name": "patient", "match": {"path": {"prefix": "/patient"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 1, "max_delay_ms": 5000}},
 {"name": "fast", "match": {"path": {"prefix": "/stacked"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}},
 {"name": "slow", "match": {"path": {"prefix": "/stacked"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 2, "burst": 1, "max_delay_ms": 1000}}]}`

// delayHeader is the response header of a request the plugin held.
const delayHeader = "X-Ratelimit-Delayed-Ms"

// TestDelay: on Envoy with four workers, both builds.
func TestDelay(t *testing.T) { forEachBuild(t, testDelay) }

func testDelay(t *testing.T, build envoytest.Build) {
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
		PluginConfig: delayConfig, UpstreamPort: up.Port(), Concurrency: 4})
	c := e.Client()
	t.Cleanup(c.Close)
	stat := func(name string) uint64 { return e.PluginStat("tokenbucket." + name) }

	t.Run("30 at once: one now, ten spaced by the rate, the rest refused at once", func(t *testing.T) {
		checkSpacing(t, c, "/smooth", "spacing-"+build.String())
		if n := stat("rule.smooth.delayed"); n < 9 {
			t.Fatalf("rule.smooth.delayed = %d, want about 10", n)
		}
		if n := stat("rule.smooth.delay_refused"); n < 15 {
			t.Fatalf("rule.smooth.delay_refused = %d, want about 19", n)
		}
	})

	t.Run("a client that hangs up while held gives its place back", func(t *testing.T) {
		key := map[string]string{"x-api-key": "hangup-" + build.String()}
		start := time.Now()
		if r := c.Get("/patient", key); r.Status != 200 || r.Header.Get(delayHeader) != "" {
			t.Fatalf("first request: %v, delayed %q; want 200 at once", r, r.Header.Get(delayHeader))
		}
		// Held one second (its moment: start + 1 s), and the next two.
		second := make(chan envoytest.Result, 1)
		go func() { second <- c.Get("/patient", key) }()
		waitFor(t, "the second request held", func() bool { return heldNow(e, "patient") >= 1 })
		ctx, cancel := context.WithCancel(context.Background())
		third := make(chan error, 1)
		go func() {
			req := c.NewRequest("GET", "/patient", key).WithContext(ctx)
			_, err := http.DefaultTransport.RoundTrip(req)
			third <- err
		}()
		waitFor(t, "the third request held", func() bool { return heldNow(e, "patient") >= 2 })
		cancel() // its moment was start + 2 s
		<-third
		waitFor(t, "the hang-up seen", func() bool { return stat("rule.patient.delay_abandoned") == 1 })
		sent := time.Since(start)
		fourth := c.Get("/patient", key)
		held, _ := strconv.Atoi(fourth.Header.Get(delayHeader))
		// Its tokens came back (it was the last holder): the fourth takes
		// its moment, start + 2 s, not start + 3 s.
		if fourth.Status != 200 || held == 0 {
			t.Fatalf("fourth request: %v, delayed %q; want held, then 200", fourth, fourth.Header.Get(delayHeader))
		}
		if goesAt := sent + time.Duration(held)*time.Millisecond; goesAt > 2600*time.Millisecond {
			t.Fatalf("fourth request went on %v after the first, want about 2 s (the place given back), not 3 s", goesAt)
		}
		if r := <-second; r.Status != 200 {
			t.Fatalf("second request: %v", r)
		}
	})

	t.Run("stacked rules hold for the longest wait", func(t *testing.T) {
		key := "stacked-" + build.String()
		res := c.Burst(4, func(int) *http.Request {
			return c.NewRequest("GET", "/stacked", map[string]string{"x-api-key": key})
		})
		var held []int
		for _, r := range res {
			if r.Status == 200 {
				d, _ := strconv.Atoi(r.Header.Get(delayHeader))
				held = append(held, d)
			}
		}
		slices.Sort(held)
		// The slow rule's 500 ms per request, minus how far apart the
		// burst's requests arrived.
		if len(held) != 3 || held[0] != 0 || held[1] < 400 || held[2] < 900 || held[2] > 1100 {
			t.Fatalf("held %v ms (statuses %v), want [0 ~500 ~1000]: the slower rule's waits", held, envoytest.Statuses(res))
		}
	})
}

// checkSpacing sends 30 requests at once on one key of a rule at 10 a
// second, burst 1, max_delay_ms 1000: one goes at once, about ten are held
// and go on spaced by the rate, never sooner, and the rest are refused at
// once with a Retry-After.
func checkSpacing(t *testing.T, c *envoytest.Client, path, key string) {
	t.Helper()
	start := time.Now()
	res := c.Burst(30, func(int) *http.Request {
		return c.NewRequest("GET", path, map[string]string{"x-api-key": key})
	})
	st := envoytest.Statuses(res)
	if st[200] < 11 || st[200] > 13 || st[429] != 30-st[200] {
		t.Fatalf("statuses %v, want 11 (up to 13 as the burst spreads) admitted, the rest refused", st)
	}
	var done []time.Duration
	var held []int
	for _, r := range res {
		switch r.Status {
		case 200:
			done = append(done, r.Elapsed)
			d, _ := strconv.Atoi(r.Header.Get(delayHeader))
			held = append(held, d)
		case 429:
			if r.Header.Get(delayHeader) != "" || r.Header.Get("Retry-After") == "" {
				t.Fatalf("a refusal: delayed %q, Retry-After %q; want refused at once with a Retry-After", r.Header.Get(delayHeader), r.Header.Get("Retry-After"))
			}
		}
	}
	slices.Sort(done)
	slices.Sort(held)
	// Never faster than the rate: the n-th admitted request cannot have
	// finished before its token was there, (n-1) × 100 ms after the first
	// was sent (less a few ms of clock rounding).
	for n, d := range done {
		if floor := time.Duration(n)*100*time.Millisecond - 10*time.Millisecond; d < floor {
			t.Fatalf("admitted request %d finished %v after the burst, before its token (%v): held %v ms", n, d, floor, held)
		}
	}
	if held[0] != 0 || held[len(held)-1] > 1000+50 {
		t.Fatalf("held %v ms: want one at once and none past max_delay_ms", held)
	}
	t.Logf("%s: %v; held %v ms; the last admitted finished %v after the burst began (%v)", path, st, held, done[len(done)-1], time.Since(start))
}

// heldNow is how many requests rule holds now, over every worker (the
// gauge rule.<name>.waiting).
func heldNow(e *envoytest.Envoy, rule string) uint64 {
	return e.PluginStat("tokenbucket.rule." + rule + ".waiting")
}

// waitFor polls ok for up to 20 s.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20 s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDelayCluster: a cluster rule through limitd holds the same way.
func TestDelayCluster(t *testing.T) { forEachBuild(t, testDelayCluster) }

func testDelayCluster(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	cfg := `{"service": {"cluster": "limit_service", "timeout_ms": 5000, "failure_mode": "deny"},
	 "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}}]}`
	e := envoytest.Start(t, envoytest.Options{Build: build, PluginConfig: cfg,
		UpstreamPort: up.Port(), ServicePort: svc, Concurrency: 4})
	c := e.Client()
	t.Cleanup(c.Close)
	checkSpacing(t, c, "/", "cluster-"+build.String()+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if n := e.PluginStat("tokenbucket.rule.fleet.delayed"); n < 9 {
		t.Fatalf("rule.fleet.delayed = %d, want about 10", n)
	}
}
