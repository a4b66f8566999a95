package e2e

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// concurrencyConfig allows four requests in flight per tenant, and under
// /wait one per tenant, a request waiting up to 3 s for its slot.
const concurrencyConfig = `{"rules": [{"name": "streams", "limit_keys": ["header:x-tenant"],
  "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 4}},
 {"name": "patient", "match": {"path": {"prefix": "/wait"}}, "limit_keys": ["header:x-tenant"],
  "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1, "max_delay_ms": 3000}}]}`

// holdingUpstream answers 200 after x-hold-ms milliseconds (or when the
// request is cancelled), and resets the connection without an answer when
// the request has x-reset.
func holdingUpstream(t *testing.T) int {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hold, _ := strconv.Atoi(r.Header.Get("x-hold-ms"))
		if hold > 0 {
			timer := time.NewTimer(time.Duration(min(hold, 10_000)) * time.Millisecond)
			select {
			case <-timer.C:
			case <-r.Context().Done():
				timer.Stop()
				return
			}
		}
		if r.Header.Get("x-reset") != "" {
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					if tc, ok := conn.(*net.TCPConn); ok {
						_ = tc.SetLinger(0) // an RST, not a FIN
					}
					conn.Close()
					return
				}
			}
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	}))
	t.Cleanup(srv.Close)
	_, p, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(p)
	return port
}

// TestConcurrency: on Envoy with four workers, both builds: the fifth
// request of a tenant in flight is refused while another tenant passes,
// and requests ended every way (complete, client reset, upstream reset,
// route timeout) give back every slot.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testConcurrency)
}

func testConcurrency(t *testing.T, build envoytest.Build) {
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
		PluginConfig: concurrencyConfig, UpstreamPort: holdingUpstream(t), Concurrency: 4,
		// Loopback is internal, so Envoy honours a request's
		// x-envoy-upstream-rq-timeout-ms (the churn's route timeouts).
		HCM: "internal_address_config: {cidr_ranges: [{address_prefix: 127.0.0.1, prefix_len: 32}]}"})
	c := e.Client()
	t.Cleanup(c.Close)
	inFlight := func() uint64 { return e.PluginStat("tokenbucket.rule.streams.in_flight") }

	// fullHouse holds four requests of tenant in flight (hold ms each),
	// checks that a fifth is refused and another tenant passes, and waits
	// for the four.
	fullHouse := func(t *testing.T, tenant string, hold int) {
		t.Helper()
		key := map[string]string{"x-tenant": tenant, "x-hold-ms": strconv.Itoa(hold)}
		res := make(chan envoytest.Result, 4)
		for range 4 {
			go func() { res <- c.Get("/", key) }()
		}
		waitFor(t, "four in flight", func() bool { return inFlight() == 4 })
		r := c.Get("/", map[string]string{"x-tenant": tenant})
		if r.Status != 429 || r.Header.Get("X-Ratelimit-Reason") != "concurrency_limit_exceeded" {
			t.Fatalf("fifth request: %v, reason %q; want 429 concurrency_limit_exceeded", r, r.Header.Get("X-Ratelimit-Reason"))
		}
		if ra := r.Header.Get("Retry-After"); ra != "1" && ra != "2" {
			t.Fatalf("Retry-After %q, want 1 or 2", ra)
		}
		if got := r.Header.Get("Ratelimit"); got != `"streams";r=0;t=1` {
			t.Fatalf("RateLimit %q", got)
		}
		if o := c.Get("/", map[string]string{"x-tenant": "other-" + tenant}); o.Status != 200 {
			t.Fatalf("another tenant: %v, want 200", o)
		}
		for range 4 {
			if r := <-res; r.Status != 200 {
				t.Fatalf("a held request: %v, want 200", r)
			}
		}
		waitFor(t, "nothing in flight", func() bool { return inFlight() == 0 })
	}

	t.Run("the fifth in flight is refused, another tenant passes", func(t *testing.T) {
		fullHouse(t, "a", 2000)
	})

	t.Run("a request waits for a slot and goes on when it frees", func(t *testing.T) {
		first := make(chan envoytest.Result, 1)
		go func() { first <- c.Get("/wait", map[string]string{"x-tenant": "w", "x-hold-ms": "800"}) }()
		waitFor(t, "the first in flight", func() bool { return e.PluginStat("tokenbucket.rule.patient.in_flight") == 1 })
		start := time.Now()
		r := c.Get("/wait", map[string]string{"x-tenant": "w"})
		took := time.Since(start)
		held, _ := strconv.Atoi(r.Header.Get("X-Ratelimit-Delayed-Ms"))
		if r.Status != 200 || held == 0 || took > 2900*time.Millisecond {
			t.Fatalf("second: %v after %v, delayed %q ms; want 200 once the first ended (held about 800 ms)", r, took, r.Header.Get("X-Ratelimit-Delayed-Ms"))
		}
		if f := <-first; f.Status != 200 {
			t.Fatalf("first: %v", f)
		}
		if n := e.PluginStat("tokenbucket.rule.patient.delayed"); n != 1 {
			t.Fatalf("rule.patient.delayed %d, want 1", n)
		}
		waitFor(t, "nothing in flight", func() bool { return e.PluginStat("tokenbucket.rule.patient.in_flight") == 0 })
		t.Logf("held %d ms behind a request of 800 ms", held)
	})

	t.Run("a client that leaves while it waits takes no slot", func(t *testing.T) {
		first := make(chan envoytest.Result, 1)
		go func() { first <- c.Get("/wait", map[string]string{"x-tenant": "leaves", "x-hold-ms": "1500"}) }()
		waitFor(t, "the first in flight", func() bool { return e.PluginStat("tokenbucket.rule.patient.in_flight") == 1 })
		ctx, cancel := context.WithCancel(context.Background())
		gone := make(chan error, 1)
		go func() {
			_, err := http.DefaultTransport.RoundTrip(c.NewRequest("GET", "/wait", map[string]string{"x-tenant": "leaves"}).WithContext(ctx))
			gone <- err
		}()
		waitFor(t, "the second waiting", func() bool { return e.PluginStat("tokenbucket.rule.patient.waiting") == 1 })
		cancel()
		<-gone
		waitFor(t, "the wait abandoned", func() bool { return e.PluginStat("tokenbucket.rule.patient.delay_abandoned") == 1 })
		if n := e.PluginStat("tokenbucket.rule.patient.waiting"); n != 0 {
			t.Fatalf("rule.patient.waiting %d after the client left, want 0", n)
		}
		if f := <-first; f.Status != 200 {
			t.Fatalf("first: %v", f)
		}
		waitFor(t, "nothing in flight", func() bool { return e.PluginStat("tokenbucket.rule.patient.in_flight") == 0 })
		if r := c.Get("/wait", map[string]string{"x-tenant": "leaves"}); r.Status != 200 || r.Header.Get("X-Ratelimit-Delayed-Ms") != "" {
			t.Fatalf("a third: %v, delayed %q; want 200 at once (the slot free)", r, r.Header.Get("X-Ratelimit-Delayed-Ms"))
		}
	})

	t.Run("churn with resets and timeouts gives every slot back", func(t *testing.T) {
		const total, tenants, clients = 10_000, 8, 32
		budget := time.Now().Add(40 * time.Second)
		var next, done atomic.Int64
		var statuses sync.Map // status (0: transport error) -> *atomic.Int64
		count := func(s int) {
			v, _ := statuses.LoadOrStore(s, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}
		var wg sync.WaitGroup
		for w := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 42))
				for next.Add(1) <= total && time.Now().Before(budget) {
					h := map[string]string{"x-tenant": "churn-" + strconv.Itoa(rng.IntN(tenants)),
						"x-hold-ms": strconv.Itoa(rng.IntN(20))}
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					switch rng.IntN(4) {
					case 1: // the client resets while the upstream holds it
						h["x-hold-ms"] = "50"
						ctx, cancel = context.WithTimeout(ctx, time.Duration(1+rng.IntN(15))*time.Millisecond)
					case 2: // the upstream resets
						h["x-reset"] = "1"
					case 3: // the route times out (Envoy's 504)
						h["x-hold-ms"] = "50"
						h["x-envoy-upstream-rq-timeout-ms"] = strconv.Itoa(1 + rng.IntN(10))
					}
					r := c.DoRequest(c.NewRequest("GET", "/", h).WithContext(ctx))
					cancel()
					if r.Err != nil {
						r.Status = 0
					}
					count(r.Status)
					done.Add(1)
				}
			}()
		}
		wg.Wait()
		got := map[int]int64{}
		statuses.Range(func(k, v any) bool { got[k.(int)] = v.(*atomic.Int64).Load(); return true })
		t.Logf("%d requests: statuses %v (0: client reset or transport error)", done.Load(), got)
		if done.Load() < 1000 || got[200] == 0 || got[429] == 0 || got[0] == 0 || got[503] == 0 || got[504] == 0 {
			t.Fatalf("%d requests, statuses %v: want at least 1000 with every kind of end", done.Load(), got)
		}
		waitFor(t, "nothing in flight after the churn", func() bool { return inFlight() == 0 })
		if lost := e.PluginStat("tokenbucket.slots_lost"); lost != 0 {
			t.Fatalf("slots_lost %d", lost)
		}
		// No slot lost nor doubled: every tenant has exactly four.
		for i := range tenants {
			fullHouse(t, "churn-"+strconv.Itoa(i), 500)
		}
	})
}
