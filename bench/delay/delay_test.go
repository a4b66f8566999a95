// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package delay

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

const (
	// rounds of 11 requests at once on a fresh key of a rule at 10 a
	// second, burst 1, max_delay_ms 1000: one goes at once, ten are held,
	// the k-th until 100 ms × k after the first.
	rounds = 20
	// held is how many requests the memory figure holds at once on one
	// worker (one per key, each waiting 50 s).
	held = 10_000
	// idleWindow is how long the idle CPU is measured.
	idleWindow = 20 * time.Second
)

const config = `{"max_keys": 1000000, "rules": [
 {"name": "smooth", "match": {"path": {"prefix": "/smooth"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}},
 {"name": "many", "match": {"path": {"prefix": "/many"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.02, "burst": 1, "max_delay_ms": 60000, "max_waiting": 20000}}]}`

// noDelay is config's rules without max_delay_ms: the idle CPU's baseline.
const noDelay = `{"rules": [{"name": "smooth", "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 10}}]}`

// arrivals is an upstream that records when each request reaches it.
type arrivals struct {
	mu  sync.Mutex
	got map[string][]time.Time // by x-api-key
	srv *http.Server
	ln  net.Listener
}

func startArrivals(t *testing.T) *arrivals {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &arrivals{got: map[string][]time.Time{}, ln: ln}
	a.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		a.mu.Lock()
		k := r.Header.Get("x-api-key")
		a.got[k] = append(a.got[k], now)
		a.mu.Unlock()
	})}
	go a.srv.Serve(ln)
	t.Cleanup(func() { a.srv.Close() })
	return a
}

func (a *arrivals) port() int { return a.ln.Addr().(*net.TCPAddr).Port }

func (a *arrivals) of(key string) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.got[key])
}

// TestDelayCost prints, for each build: how late held requests go on (p50,
// p99, max, four workers), the plugin's Go heap per held request with
// 10,000 held on one worker, and an idle Envoy's CPU once every hold is
// over, beside one whose rule never holds. With DELAY_PAGE set it also
// writes them as a Markdown page there (make bench-delay writes
// docs/benchmarks/delay.md).
func TestDelayCost(t *testing.T) {
	if os.Getenv("DELAY_COST") == "" {
		t.Skip("set DELAY_COST=1 (make bench-delay) to measure what holding requests costs")
	}
	start, loadBefore := time.Now(), loadAvg()
	t.Logf("load before: %s", loadBefore)
	var rows []string
	for _, b := range envoytest.Builds {
		l := lateness(t, b)
		m := memory(t, b)
		i := idle(t, b)
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s |", b, l, m, i))
	}
	loadAfter := loadAvg()
	t.Logf("load after: %s", loadAfter)
	if out := os.Getenv("DELAY_PAGE"); out != "" {
		page := fmt.Sprintf(`# What holding requests costs

Written by `+"`make bench-delay`"+` (bench/delay's TestDelayCost) on %s UTC in %v; load average %s at the start, %s
at the end. What it measures and why: [docs/delay.md](../delay.md). Each build runs in real Envoy:

- **Late by**: a rule at 10 a second, burst 1, `+"`max_delay_ms`"+` 1000, four workers; %d bursts of 11 requests at once
  on a fresh key. The k-th held request should reach the upstream 100 ms × k after the first; the figures are how much
  later it came (p50, p99, max of every held request).
- **Heap per held request**: %d requests held at once on one worker (a key each, each waiting up to 60 s); the
  plugin's Go heap (`+"`memory.heap_bytes`"+`) before and while they are held, divided by the requests held.
- **Idle CPU**: an Envoy of four workers over %v once every hold is over, beside one whose rule never holds: what an
  idle plugin pays for the timer.

| build | late by: p50 / p99 / max | heap per held request | idle CPU: after holding / never holding |
|---|---|---|---|
%s
`, start.UTC().Format("2006-01-02 15:04"), time.Since(start).Round(time.Second), loadBefore, loadAfter,
			rounds, held, idleWindow, strings.Join(rows, "\n"))
		if err := os.WriteFile(out, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func lateness(t *testing.T, b envoytest.Build) string {
	up := startArrivals(t)
	e := envoytest.Start(t, envoytest.Options{Build: b, Config: envoytest.DemoConfigYAML, PluginConfig: config,
		UpstreamPort: up.port(), Concurrency: 4})
	defer e.Stop()
	c := e.Client()
	defer c.Close()
	var late []time.Duration
	for r := range rounds {
		key := "late-" + strconv.Itoa(r)
		res := c.Burst(11, func(int) *http.Request {
			return c.NewRequest("GET", "/smooth", map[string]string{"x-api-key": key})
		})
		if st := envoytest.Statuses(res); st[200] != 11 {
			continue // the burst spread past one token's refill: its moments are not k × 100 ms
		}
		at := up.of(key)
		slices.SortFunc(at, func(x, y time.Time) int { return x.Compare(y) })
		for k := 1; k < len(at); k++ {
			late = append(late, at[k].Sub(at[0])-time.Duration(k)*100*time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(late) == 0 {
		t.Fatalf("%s: no round admitted exactly 11", b)
	}
	slices.Sort(late)
	q := func(p float64) time.Duration { return late[min(len(late)-1, int(p*float64(len(late))))] }
	t.Logf("%s: held requests went on late by p50 %v, p99 %v, max %v, earliest %v (%d held requests, 4 workers; upstream arrival against the first request's + k × 100 ms)",
		b, q(0.5).Round(10*time.Microsecond), q(0.99).Round(10*time.Microsecond), late[len(late)-1].Round(10*time.Microsecond), late[0].Round(10*time.Microsecond), len(late))
	return fmt.Sprintf("%v / %v / %v", q(0.5).Round(10*time.Microsecond), q(0.99).Round(10*time.Microsecond), late[len(late)-1].Round(10*time.Microsecond))
}

func memory(t *testing.T, b envoytest.Build) string {
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Build: b, Config: envoytest.DemoConfigYAML, PluginConfig: config,
		UpstreamPort: up.Port(), Concurrency: 1})
	defer e.Stop()
	c := e.Client()
	defer c.Close()
	stat := func(name string) uint64 { return e.PluginStat("tokenbucket." + name) }
	keyOf := func(i int) map[string]string { return map[string]string{"x-api-key": "held-" + strconv.Itoa(i)} }
	for from := 0; from < held; from += envoytest.MaxBurst {
		c.Burst(envoytest.MaxBurst, func(i int) *http.Request { return c.NewRequest("GET", "/many", keyOf(from+i)) })
	}
	time.Sleep(2500 * time.Millisecond)
	before := stat("memory.heap_bytes")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	for i := range held {
		if i%500 == 0 {
			time.Sleep(100 * time.Millisecond)
		}
		go func() {
			for range 5 {
				resp, err := hc.Do(c.NewRequest("GET", "/many", keyOf(i)).WithContext(ctx))
				if err == nil {
					resp.Body.Close()
					return
				}
				if ctx.Err() != nil {
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
		}()
	}
	deadline := time.Now().Add(40 * time.Second)
	for stat("rule.many.waiting") < held && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	n := stat("rule.many.waiting")
	time.Sleep(2500 * time.Millisecond)
	after := stat("memory.heap_bytes")
	t.Logf("%s: %d requests held on one worker: the plugin's Go heap %d -> %d bytes, %.0f bytes per held request",
		b, n, before, after, (float64(after)-float64(before))/float64(max(n, 1)))
	cancel()
	return fmt.Sprintf("%.0f bytes (%d held)", (float64(after)-float64(before))/float64(max(n, 1)), n)
}

func idle(t *testing.T, b envoytest.Build) string {
	envs := [2]*envoytest.Envoy{}
	for i, cfg := range [2]string{config, noDelay} {
		up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
		envs[i] = envoytest.Start(t, envoytest.Options{Build: b, Config: envoytest.DemoConfigYAML, PluginConfig: cfg,
			UpstreamPort: up.Port(), Concurrency: 4})
		defer envs[i].Stop()
	}
	// The holding Envoy holds requests first, then none.
	c := envs[0].Client()
	c.Burst(11, func(int) *http.Request {
		return c.NewRequest("GET", "/smooth", map[string]string{"x-api-key": "idle"})
	})
	c.Close()
	time.Sleep(3 * time.Second)
	cpu0, t0 := [2]time.Duration{envs[0].CPU(), envs[1].CPU()}, time.Now()
	time.Sleep(idleWindow)
	var share [2]float64
	for i, what := range [2]string{"after holding 10 requests, nothing held", "a rule that never holds"} {
		used := envs[i].CPU() - cpu0[i]
		share[i] = 100 * float64(used) / float64(time.Since(t0))
		t.Logf("%s: idle Envoy (4 workers), %s: %v of CPU over %v, %.3f%% of a CPU",
			b, what, used, time.Since(t0).Round(time.Second), share[i])
	}
	return fmt.Sprintf("%.3f%% / %.3f%% of a CPU", share[0], share[1])
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ") // the 1, 5 and 15 minute averages
}
