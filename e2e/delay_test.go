package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
//
// Serial: it measures how long Envoy holds requests against max_delay_ms,
// which a CPU shared with other tests' Envoys would make late.
func TestDelay(t *testing.T) {
	forEachBuild(t, testDelay)
}

func testDelay(t *testing.T, build envoytest.Build) {
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
		PluginConfig: delayConfig, UpstreamPort: up.Port(), Concurrency: 4})
	c := e.Client()
	t.Cleanup(c.Close)
	stat := func(name string) uint64 { return e.PluginStat("tokenbucket." + name) }

	t.Run("30 at once: one now, ten spaced by the rate, the rest refused at once", func(t *testing.T) {
		checkSpacing(t, c, "/smooth", "spacing-"+build.String(), 11)
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
// once with a Retry-After. At least least are admitted (11 when the held
// requests' tokens are reserved; fewer on a lease, see TestDelayLease).
func checkSpacing(t *testing.T, c *envoytest.Client, path, key string, least int) {
	t.Helper()
	start := time.Now()
	res := c.Burst(30, func(int) *http.Request {
		return c.NewRequest("GET", path, map[string]string{"x-api-key": key})
	})
	st := envoytest.Statuses(res)
	if st[200] < least || st[200] > 13 || st[429] != 30-st[200] {
		t.Fatalf("statuses %v, want %d (up to 13 as the burst spreads) admitted, the rest refused", st, least)
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
	// A held request goes on late by its timer's lateness on a loaded
	// machine (tens of ms), never sooner.
	if held[0] != 0 || held[len(held)-1] > 1000+200 {
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
//
// Serial: it measures how long Envoy holds requests against max_delay_ms,
// which a CPU shared with other tests' Envoys would make late.
func TestDelayCluster(t *testing.T) {
	forEachBuild(t, testDelayCluster)
}

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
	checkSpacing(t, c, "/", "cluster-"+build.String()+"-"+strconv.FormatInt(time.Now().UnixNano(), 36), 11)
	if n := e.PluginStat("tokenbucket.rule.fleet.delayed"); n < 9 {
		t.Fatalf("rule.fleet.delayed = %d, want about 10", n)
	}
}

// TestDelayClusterMaxWaiting: max_waiting bounds a cluster rule's held
// requests on one worker though each is held only once limitd answered:
// eight requests at once, on a rule that holds two (a request counts from
// its decision, not from its hold), are one at once, at most two held and
// the rest refused at once as full. The held ones go on 2 s apart, so the
// eight are decided long before a place frees.
//
// Serial: it measures how long Envoy holds requests against max_delay_ms,
// which a CPU shared with other tests' Envoys would make late.
func TestDelayClusterMaxWaiting(t *testing.T) {
	forEachBuild(t, testDelayClusterMaxWaiting)
}

func testDelayClusterMaxWaiting(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	cfg := `{"service": {"cluster": "limit_service", "timeout_ms": 5000, "failure_mode": "deny"},
	 "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 0.5, "burst": 1, "max_delay_ms": 10000, "max_waiting": 2}}]}`
	e := envoytest.Start(t, envoytest.Options{Build: build, PluginConfig: cfg,
		UpstreamPort: up.Port(), ServicePort: svc, Concurrency: 1})
	c := e.Client()
	t.Cleanup(c.Close)
	key := "max-waiting-" + build.String() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	res := c.Burst(8, func(int) *http.Request {
		return c.NewRequest("GET", "/", map[string]string{"x-api-key": key})
	})
	held := 0
	for _, r := range res {
		if r.Status == 200 && r.Header.Get(delayHeader) != "" && r.Header.Get(delayHeader) != "0" {
			held++
		}
	}
	st := envoytest.Statuses(res)
	full := e.PluginStat("tokenbucket.rule.fleet.waiting_full")
	t.Logf("statuses %v, held %d, waiting_full %d", st, held, full)
	if held > 2 || st[200] > 3 || st[200]+st[429] != 8 || uint64(st[429]) != full {
		t.Fatalf("statuses %v, held %d, waiting_full %d; want one at once, at most max_waiting 2 held, the rest refused as full", st, held, full)
	}
}

// TestDelayClusterHangUps: clients that hang up while a cluster rule holds
// them do not lift the rate: twenty requests at once on a rule at 10 a
// second (one at once, nineteen held 100 ms apart), nine of the held ones
// hang up, then twenty more arrive at once. Counted where the upstream
// receives them, the requests never exceed burst + rate × t over any
// interval (plus two for the timers' lateness on a loaded machine): an
// abandoned request's tokens stay spent, so a newcomer never goes on
// beside the holders behind it (with refunds, nine more went through).
//
// Serial: it measures how long Envoy holds requests against max_delay_ms,
// which a CPU shared with other tests' Envoys would make late.
func TestDelayClusterHangUps(t *testing.T) {
	forEachBuild(t, testDelayClusterHangUps)
}

func testDelayClusterHangUps(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	var mu sync.Mutex
	var arrived []time.Time
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived = append(arrived, time.Now())
		mu.Unlock()
		_, _ = io.WriteString(w, "ok\n")
	}))
	t.Cleanup(up.Close)
	_, port, err := net.SplitHostPort(up.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	upPort, _ := strconv.Atoi(port)
	cfg := `{"service": {"cluster": "limit_service", "timeout_ms": 5000, "failure_mode": "deny"},
	 "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 5000}}]}`
	e := envoytest.Start(t, envoytest.Options{Build: build, PluginConfig: cfg,
		UpstreamPort: upPort, ServicePort: svc, Concurrency: 2})
	c := e.Client()
	t.Cleanup(c.Close)
	key := map[string]string{"x-api-key": "hang-ups-" + build.String() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	stat := func(name string) uint64 { return e.PluginStat("tokenbucket.rule.fleet." + name) }

	const first, gone = 20, 9
	cancels := make([]context.CancelFunc, first)
	finished := make([]atomic.Bool, first)
	done := make(chan struct{}, first)
	for i := range first {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cancels[i] = cancel
		go func() {
			defer func() { finished[i].Store(true); done <- struct{}{} }()
			if resp, err := http.DefaultTransport.RoundTrip(c.NewRequest("GET", "/", key).WithContext(ctx)); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	waitFor(t, "nineteen held", func() bool { return heldNow(e, "fleet") >= first-1 })
	waitFor(t, "the first answered", func() bool {
		for i := range finished {
			if finished[i].Load() {
				return true
			}
		}
		return false
	})
	// Nine of those still held hang up, every other one first: whatever
	// order they were held in, some wait behind them.
	n := 0
	for _, i := range append(evens(first), odds(first)...) {
		if n < gone && !finished[i].Load() {
			cancels[i]()
			cancels[i] = nil
			n++
		}
	}
	if n < gone {
		t.Fatalf("only %d requests still held to hang up, want %d", n, gone)
	}
	waitFor(t, "the hang-ups seen", func() bool { return stat("delay_abandoned") >= gone })
	res := c.Burst(20, func(int) *http.Request { return c.NewRequest("GET", "/", key) })
	for range first {
		<-done
	}
	for _, cancel := range cancels {
		if cancel != nil {
			cancel()
		}
	}
	mu.Lock()
	at := slices.Clone(arrived)
	mu.Unlock()
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	t.Logf("second burst %v; %d reached the upstream over %v", envoytest.Statuses(res), len(at), at[len(at)-1].Sub(at[0]))
	if len(at) < first-gone {
		t.Fatalf("%d reached the upstream, want at least the %d that did not hang up", len(at), first-gone)
	}
	worst, wi, wj := 0.0, 0, 0 // the interval most over burst + rate × t
	for i := range at {
		for j := i; j < len(at); j++ {
			if over := float64(j-i+1) - (1 + 10*at[j].Sub(at[i]).Seconds()); over > worst {
				worst, wi, wj = over, i, j
			}
		}
	}
	t.Logf("the interval most over burst + rate × t: %d requests within %v, %.1f over", wj-wi+1, at[wj].Sub(at[wi]), worst)
	if worst > 2 {
		t.Fatalf("%d requests reached the upstream within %v: %.1f over burst + rate × t, want at most 2 (timers' lateness)", wj-wi+1, at[wj].Sub(at[wi]), worst)
	}
}

// evens and odds are the even and the odd numbers below n.
func evens(n int) []int { return everyOther(0, n) }
func odds(n int) []int  { return everyOther(1, n) }

func everyOther(from, n int) []int {
	var out []int
	for i := from; i < n; i += 2 {
		out = append(out, i)
	}
	return out
}

// TestDelayLease: a leased cluster rule through limitd holds on its lease:
// one request at once, about ten spaced by the rate as the lease's refills
// grant their tokens (never faster), the rest refused at once. A lease
// takes no debt, so with a burst of 1 the global bucket cannot bank the
// next token while a turn's refill call travels: each turn loses that
// call's latency, and on a loaded machine a token or two of the second is
// lost (at least 9 admitted, never more than the rate allows).
//
// Serial: it measures how long Envoy holds requests against max_delay_ms,
// which a CPU shared with other tests' Envoys would make late.
func TestDelayLease(t *testing.T) {
	forEachBuild(t, testDelayLease)
}

func testDelayLease(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	cfg := `{"service": {"cluster": "limit_service", "timeout_ms": 5000, "failure_mode": "deny"},
	 "rules": [{"name": "fleet", "scope": "cluster", "sync": "lease", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}}]}`
	e := envoytest.Start(t, envoytest.Options{Build: build, PluginConfig: cfg,
		UpstreamPort: up.Port(), ServicePort: svc, Concurrency: 4})
	c := e.Client()
	t.Cleanup(c.Close)
	checkSpacing(t, c, "/", "lease-"+build.String()+"-"+strconv.FormatInt(time.Now().UnixNano(), 36), 9)
	if n := e.PluginStat("tokenbucket.rule.fleet.delay_refused"); n == 0 {
		t.Fatalf("rule.fleet.delay_refused = 0, want the requests past the bound counted")
	}
	if n := e.PluginStat("tokenbucket.rule.fleet.delayed"); n < 8 {
		t.Fatalf("rule.fleet.delayed = %d, want about 10", n)
	}
	waitFor(t, "no request held", func() bool { return heldNow(e, "fleet") == 0 })
}

// manyHeld is how many requests TestDelayManyHeld holds at once on one
// worker, and maxHeldBytes the plugin's memory per held request the docs
// state (docs/delay.md).
const (
	manyHeld     = 10_000
	maxHeldBytes = 4 << 10
)

// TestDelayManyHeld: one worker holds 10,000 requests (one per key, each
// waiting up to 50 s for its key's second token): nothing fails, the rule
// counts them all as waiting, and the plugin's Go heap (tokenbucket.memory.
// heap_bytes: the allocated heap its runtime reports, not an RSS sample)
// grows by at most maxHeldBytes per held request. Then every client hangs
// up: each held request gives its tokens back, none goes upstream.
//
// A second request is answered at once instead when its key's bucket was
// evicted (the table's groups are placed by a per-process seed, so a few of
// 10,000 keys may share a full group: engine/store), or its token came
// back: the test counts those apart, and no more of them than evictions and
// requests that went on.
//
// Serial: it measures how long Envoy holds requests against max_delay_ms,
// which a CPU shared with other tests' Envoys would make late.
func TestDelayManyHeld(t *testing.T) {
	forEachBuild(t, testDelayManyHeld)
}

func testDelayManyHeld(t *testing.T, build envoytest.Build) {
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	cfg := `{"max_keys": 1000000, "rules": [{"name": "many", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 0.02, "burst": 1, "max_delay_ms": 60000, "max_waiting": 20000}}]}`
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
		PluginConfig: cfg, UpstreamPort: up.Port(), Concurrency: 1})
	c := e.Client()
	t.Cleanup(c.Close)
	stat := func(name string) uint64 { return e.PluginStat("tokenbucket." + name) }
	keyOf := func(i int) map[string]string {
		return map[string]string{"x-api-key": "held-" + strconv.Itoa(i)}
	}
	// Each key's first request takes its one token.
	for from := 0; from < manyHeld; from += envoytest.MaxBurst {
		res := c.Burst(envoytest.MaxBurst, func(i int) *http.Request { return c.NewRequest("GET", "/", keyOf(from+i)) })
		if st := envoytest.Statuses(res); st[200] != envoytest.MaxBurst {
			t.Fatalf("priming: %v", st)
		}
	}
	time.Sleep(2500 * time.Millisecond) // two ticks: the heap after priming
	before := stat("memory.heap_bytes")

	// Each key's second request is held 50 s; its client gives up at the end.
	ctx, cancel := context.WithCancel(context.Background())
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: -1, DisableKeepAlives: true}
	hc := &http.Client{Transport: tr}
	done := make(chan int, manyHeld)
	for i := range manyHeld {
		if i%500 == 0 {
			time.Sleep(100 * time.Millisecond) // spread the connects over the listen backlog
		}
		go func() {
			// A connection refused under the flood of connects never
			// reached Envoy: it is tried again (at most 5 times).
			for range 5 {
				req := c.NewRequest("GET", "/", keyOf(i)).WithContext(ctx)
				resp, err := hc.Do(req)
				if err == nil {
					resp.Body.Close()
					done <- resp.StatusCode
					return
				}
				if ctx.Err() != nil {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			done <- 0
		}()
	}
	defer cancel()
	// answered counts the second requests answered rather than held; each
	// must be explained by an eviction or a token that came back.
	answered := 0
	take := func(status int) {
		if status != 200 {
			t.Fatalf("a second request was answered %d, want held (or 200)", status)
		}
		answered++
	}
	explained := func() {
		if evicted, wentOn := stat("evictions"), stat("rule.many.delayed"); uint64(answered) > evicted+wentOn {
			t.Fatalf("%d second requests answered at once, more than the %d buckets evicted and %d held requests that went on", answered, evicted, wentOn)
		}
	}
	deadline := time.Now().Add(40 * time.Second)
	for heldNow(e, "many")+uint64(answered) < manyHeld {
		select {
		case st := <-done:
			take(st)
			continue
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 40 s %d held, %d answered (allowed %d, evictions %d, abandoned %d, delayed %d, refused %d, full %d)", heldNow(e, "many"), answered, stat("rule.many.allowed"), stat("evictions"), stat("rule.many.delay_abandoned"), stat("rule.many.delayed"),
				stat("rule.many.delay_refused"), stat("rule.many.waiting_full"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	explained()
	nHeld := manyHeld - answered
	if answered > manyHeld/100 {
		t.Fatalf("%d of %d second requests answered at once: too few held to measure", answered, manyHeld)
	}
	time.Sleep(2500 * time.Millisecond) // two ticks: the heap with every request held
	held := stat("memory.heap_bytes")
	perHeld := (float64(held) - float64(before)) / float64(nHeld)
	t.Logf("%d held on one worker (%d answered at once, %d evictions): plugin heap %d -> %d bytes, %.0f bytes per held request (load %s)", nHeld, answered, stat("evictions"), before, held, perHeld, loadAvg())
	if perHeld > maxHeldBytes {
		t.Fatalf("%.0f bytes per held request, more than the %d the docs state", perHeld, maxHeldBytes)
	}
	cancel()
	for range nHeld {
		if st := <-done; st != 0 {
			take(st) // its token came back before its client left
		}
	}
	explained()
	waitFor(t, "every hang-up seen", func() bool { return stat("rule.many.delay_abandoned") == uint64(manyHeld-answered) })
	if n := stat("rule.many.delayed"); n > uint64(answered) {
		t.Fatalf("%d held requests went on, more than the %d answered", n, answered)
	}
}

// loadAvg is the machine's load, for the log.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// TestDelayRouteTimeout pins which of Envoy's timeouts count the time a
// request is held (docs/delay.md): the route's timeout starts when the
// router gets the request, after the hold, so a request held 2 s under a
// 1 s route timeout is served (the same route answers 504 to an upstream
// slower than 1 s); the connection manager's stream_idle_timeout does
// count it, so a request held past it is ended and gives its place back.
//
// Serial: it measures how long Envoy holds requests against max_delay_ms,
// which a CPU shared with other tests' Envoys would make late.
func TestDelayRouteTimeout(t *testing.T) {
	forEachBuild(t, testDelayRouteTimeout)
}

func testDelayRouteTimeout(t *testing.T, build envoytest.Build) {
	// The upstream answers at once, or after x-upstream-delay-ms (at most
	// 3 s, or until Envoy gives up on the request).
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ms, _ := strconv.Atoi(r.Header.Get("x-upstream-delay-ms")); ms > 0 {
			select {
			case <-time.After(time.Duration(min(ms, 3000)) * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, "ok\n")
	}))
	t.Cleanup(up.Close)
	_, port, err := net.SplitHostPort(up.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	upPort, _ := strconv.Atoi(port)
	e := envoytest.Start(t, envoytest.Options{Build: build, UpstreamPort: upPort, Concurrency: 1,
		Config: envoytest.DemoConfigYAML, RouteTimeout: "1s",
		HCM: "stream_idle_timeout: 3s",
		PluginConfig: `{"rules": [{"name": "patient", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 0.2, "burst": 1, "max_delay_ms": 10000}}]}`})
	c := e.Client()
	t.Cleanup(c.Close)
	stat := func(name string) uint64 { return e.PluginStat("tokenbucket.rule.patient." + name) }

	// The route timeout is in force: an upstream slower than 1 s is 504.
	if r := c.Get("/", map[string]string{"x-api-key": "slow-" + build.String(), "x-upstream-delay-ms": "2000"}); r.Status != 504 {
		t.Fatalf("upstream slower than the route timeout: %v, want 504", r)
	}
	key := map[string]string{"x-api-key": "held-" + build.String()}
	start := time.Now()
	if r := c.Get("/", key); r.Status != 200 || r.Header.Get(delayHeader) != "" {
		t.Fatalf("first request: %v, want 200 at once", r)
	}
	// The second's token is there 5 s after the first: past the stream's
	// idle timeout (3 s), which ends it while held; it was the last in
	// line, so its place comes back.
	second := c.Get("/", key)
	if second.Status == 200 || stat("delay_abandoned") != 1 {
		t.Fatalf("held past stream_idle_timeout: %v (%v, %v), delay_abandoned %d; want ended by Envoy, abandoned", second, second.Elapsed, second.Header, stat("delay_abandoned"))
	}
	t.Logf("held past stream_idle_timeout: status %d after %v", second.Status, second.Elapsed)
	// The third, sent about 3 s after the first, is held until 5 s after
	// it: about 2 s, twice the route timeout, and served.
	third := c.Get("/", key)
	held, _ := strconv.Atoi(third.Header.Get(delayHeader))
	if third.Status != 200 || held < 1200 {
		t.Fatalf("held under a 1 s route timeout: %v, delayed %d ms; want 200 after more than the route timeout", third, held)
	}
	t.Logf("held %d ms under a 1 s route timeout, served %v after the first", held, time.Since(start))
}
