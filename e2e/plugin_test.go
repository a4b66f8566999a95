package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// mainConfig has a per-key rule (burst 50, 10/s, cost by header), one that
// barely refills (for exact counts under concurrency), a slow rule for
// Retry-After jitter and a generous one for the soak.
const mainConfig = `{"rules": [
 {"name": "slow", "match": {"path": {"prefix": "/slow"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.1, "burst": 1}},
 {"name": "soak", "match": {"path": {"prefix": "/soak"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1000000, "burst": 1000000}},
 {"name": "exact", "match": {"path": {"prefix": "/exact"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 50}},
 {"name": "per-key", "match": {"path": {"prefix": "/api"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 10, "burst": 50, "cost_source": "header:x-cost", "default_cost": 1}}]}`

func startMain(t *testing.T, build envoytest.Build) (*envoytest.Envoy, *envoytest.Client) {
	t.Helper()
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Build: build,
		Config: envoytest.DemoConfigYAML, PluginConfig: mainConfig,
		UpstreamPort: up.Port(), Concurrency: 4,
	})
	c := e.Client()
	t.Cleanup(c.Close)
	return e, c
}

func get(c *envoytest.Client, path, key string, extra ...string) envoytest.Result {
	h := map[string]string{"x-api-key": key}
	for i := 0; i+1 < len(extra); i += 2 {
		h[extra[i]] = extra[i+1]
	}
	return c.Get(path, h)
}

func TestPlugin(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testPlugin)
}

func testPlugin(t *testing.T, build envoytest.Build) {
	e, c := startMain(t, build)
	stat := func(name string) uint64 { return e.PluginStat("tokenbucket." + name) }

	t.Run("concurrent burst admits exactly burst", func(t *testing.T) {
		for round, key := range []string{"burst-1", "burst-2", "burst-3"} {
			res := c.Burst(200, func(int) *http.Request {
				return c.NewRequest("GET", "/exact", map[string]string{"x-api-key": key})
			})
			st := envoytest.Statuses(res)
			if st[200] != 50 || st[429] != 150 {
				t.Fatalf("round %d: statuses %v, want exactly 50 admitted and 150 rejected", round, st)
			}
			t.Logf("round %d: %v in %v", round, st, maxElapsed(res))
		}
		if n := stat("rule.exact.failed_open"); n != 0 {
			t.Fatalf("%d requests failed open during the bursts", n)
		}
		t.Logf("CAS retries so far: %d", stat("cas_retries"))
	})

	// On the rule that barely refills: on "per-key" (10 a second) the 50
	// requests took over 100 ms on a loaded machine, a token came back, and
	// the 51st was rightly admitted.
	t.Run("keys are isolated", func(t *testing.T) {
		for i := 0; i < 50; i++ {
			get(c, "/exact/iso", "iso-a")
		}
		if r := get(c, "/exact/iso", "iso-a"); r.Status != 429 {
			t.Fatalf("iso-a after its burst: %d, want 429", r.Status)
		}
		if r := get(c, "/exact/iso", "iso-b"); r.Status != 200 || r.Header.Get("RateLimit-Remaining") != "49" {
			t.Fatalf("iso-b: %d remaining %q, want 200 and 49", r.Status, r.Header.Get("RateLimit-Remaining"))
		}
	})

	// Drained until its first refusal (a slow machine's 60 requests
	// would leave tokens), then polled for 2 s: about 10 a second come
	// back, or one a poll when the polls are slower than that.
	t.Run("tokens refill at the configured rate", func(t *testing.T) {
		for i := 0; get(c, "/api/refill", "refill").Status == 200; i++ {
			if i == 1000 {
				t.Fatal("1000 requests of a key admitted at 10 a second, burst 50")
			}
		}
		start := time.Now()
		admitted, polls := 0, 0
		for time.Since(start) < 2*time.Second { // bounded: about 2 s of polling
			polls++
			if get(c, "/api/refill", "refill").Status == 200 {
				admitted++
			}
			time.Sleep(5 * time.Millisecond)
		}
		elapsed := time.Since(start).Seconds()
		if lo, hi := min(int(10*elapsed), polls)-2, int(10*elapsed)+2; admitted < lo || admitted > hi {
			t.Fatalf("admitted %d of %d over %.2fs at 10/s, want %d..%d", admitted, polls, elapsed, lo, hi)
		}
	})

	t.Run("cost header", func(t *testing.T) {
		start := time.Now()
		if r := get(c, "/api/cost", "cost", "x-cost", "7"); r.Header.Get("RateLimit-Remaining") != "43" {
			t.Fatalf("cost 7: remaining %q, want 43", r.Header.Get("RateLimit-Remaining"))
		}
		r := get(c, "/api/cost", "cost", "x-cost", "lots")
		// A token refills every 100 ms between the two.
		refill := int(10 * time.Since(start).Seconds())
		if n, err := strconv.Atoi(r.Header.Get("RateLimit-Remaining")); err != nil || n < 42 || n > 42+refill {
			t.Fatalf("non-numeric cost: remaining %q, want 42 (default cost 1; + at most %d refilled)", r.Header.Get("RateLimit-Remaining"), refill)
		}
	})

	t.Run("headers and jittered Retry-After", func(t *testing.T) {
		ok := get(c, "/api/h", "hdr")
		want := map[string]string{
			"RateLimit-Policy": `"per-key";q=50;w=5`, "RateLimit": `"per-key";r=49;t=1`,
			"RateLimit-Limit": "50", "RateLimit-Remaining": "49", "RateLimit-Reset": "1",
		}
		for k, v := range want {
			if got := ok.Header.Values(k); len(got) != 1 || got[0] != v {
				t.Errorf("allowed: %s = %q, want once %q", k, got, v)
			}
		}
		retry := map[string]bool{}
		for i := 0; i < 30; i++ {
			key := "jitter-" + strconv.Itoa(i)
			get(c, "/slow", key)
			r1, r2 := get(c, "/slow", key), get(c, "/slow", key)
			ra, err := strconv.Atoi(r1.Header.Get("Retry-After"))
			if r1.Status != 429 || err != nil || ra < 10 || ra > 15 {
				t.Fatalf("%s: %d Retry-After %q, want 429 within [10, 15]", key, r1.Status, r1.Header.Get("Retry-After"))
			}
			if r2.Header.Get("Retry-After") != r1.Header.Get("Retry-After") {
				t.Fatalf("%s: Retry-After %s then %s for the same client", key, r1.Header.Get("Retry-After"), r2.Header.Get("Retry-After"))
			}
			for _, h := range []string{"RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "X-RateLimit-Reason"} {
				if len(r1.Header.Values(h)) != 1 {
					t.Fatalf("rejected: %s appears %d times", h, len(r1.Header.Values(h)))
				}
			}
			if r1.Header.Get("X-RateLimit-Reason") != "token_bucket_exceeded" || !strings.Contains(string(r1.Body), `"rule":"slow"`) {
				t.Fatalf("rejected: reason %q body %s", r1.Header.Get("X-RateLimit-Reason"), r1.Body)
			}
			retry[r1.Header.Get("Retry-After")] = true
		}
		if len(retry) < 3 {
			t.Errorf("30 clients got only %d distinct Retry-After values: %v", len(retry), retry)
		}
	})

	t.Run("stats counters", func(t *testing.T) {
		before := stat("rule.per-key.allowed") + stat("rule.per-key.rejected")
		for i := 0; i < 60; i++ {
			get(c, "/api/stats", "stats")
		}
		allowed, rejected := stat("rule.per-key.allowed"), stat("rule.per-key.rejected")
		if allowed+rejected-before != 60 {
			t.Fatalf("allowed+rejected grew by %d, want 60", allowed+rejected-before)
		}
		if stat("rule.per-key.failed_open") != 0 {
			t.Fatalf("failed_open = %d", stat("rule.per-key.failed_open"))
		}
	})

	// Wasm only: the soak watches the Go runtime of the Wasm VMs collect
	// (the host's poll_oneoff) and their heaps stay level.
	if build == envoytest.Wasm {
		t.Run("soak", func(t *testing.T) {
			soak(t, e, c)
		})
	}
}

func maxElapsed(res []envoytest.Result) time.Duration {
	var m time.Duration
	for _, r := range res {
		m = max(m, r.Elapsed)
	}
	return m
}

// soak sends 100k requests with 4 KiB keys, so the plugin allocates about
// 400 MB and collects many times, then checks Envoy still serves and the
// plugin's heap did not grow between the first and the last fifth.
func soak(t *testing.T, e *envoytest.Envoy, c *envoytest.Client) {
	const total, workers = 100_000, 8
	pad := strings.Repeat("k", 4096)
	gc0 := e.PluginStat("tokenbucket.memory.gc_cycles")
	var heapEarly, allocEarly uint64
	// Envoy's own memory: what its allocator handed out, not one
	// resident-memory reading (see envoytest.Trend).
	alloc := func() uint64 {
		m, err := e.Memory()
		if err != nil {
			t.Fatal(err)
		}
		return m.Allocated
	}
	sent := 0
	deadline := time.Now().Add(5 * time.Minute)
	for sent < total && time.Now().Before(deadline) {
		res := c.Burst(workers*25, func(i int) *http.Request {
			return c.NewRequest("GET", "/soak", map[string]string{"x-api-key": pad + strconv.Itoa((sent+i)%5000)})
		})
		for _, r := range res {
			if r.Status != 200 {
				t.Fatalf("after %d requests: %v", sent, r)
			}
		}
		sent += len(res)
		if heapEarly == 0 && sent >= total/5 {
			time.Sleep(1100 * time.Millisecond) // let every worker tick its gauges once
			heapEarly, allocEarly = e.PluginStat("tokenbucket.memory.sys_bytes"), alloc()
		}
	}
	if sent < total {
		t.Fatalf("sent only %d requests in 5 minutes", sent)
	}
	time.Sleep(1100 * time.Millisecond)
	heapLate, allocLate := e.PluginStat("tokenbucket.memory.sys_bytes"), alloc()
	gcs := e.PluginStat("tokenbucket.memory.gc_cycles") - gc0
	t.Logf("soak: %d requests; plugin GC cycles (all workers) +%d; plugin sys (all workers) %d -> %d KiB; Envoy allocated %d -> %d MiB, RSS %d MiB",
		sent, gcs, heapEarly>>10, heapLate>>10, allocEarly>>20, allocLate>>20, e.RSS()>>20)
	if gcs < 10 {
		t.Errorf("only %d garbage collections: the soak did not exercise the GC", gcs)
	}
	if heapLate > heapEarly+heapEarly/2 {
		t.Errorf("plugin memory grew from %d to %d bytes", heapEarly, heapLate)
	}
	if allocLate > allocEarly+64<<20 {
		t.Errorf("Envoy's allocated memory grew from %d to %d MiB", allocEarly>>20, allocLate>>20)
	}
	if r := get(c, "/api/after-soak", "after"); r.Status != 200 {
		t.Fatalf("after the soak: %v", r)
	}
}

func TestBadConfigurationRefused(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testBadConfigurationRefused)
}

func testBadConfigurationRefused(t *testing.T, build envoytest.Build) {
	bad := `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 10, "burst": 5}}]}`
	f := envoytest.ExpectStartFailure(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML, PluginConfig: bad, UpstreamPort: 1})
	const msg = "rules[0].algorithm_config.burst: must be >= tokens_per_second (10), got 5"
	if !strings.Contains(f.Log, msg) {
		t.Fatalf("%v; Envoy's log does not carry %q:\n%s", f, msg, f.Log)
	}
	t.Logf("bad configuration: %v", f)
}
