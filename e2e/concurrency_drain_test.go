package e2e

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// A concurrency rule's configuration, max_in_flight n, with a marker rule
// whose name says which configuration answers (reconfigEnv.update).
func drainConfig(n int, marker string) string {
	return `{"rules": [{"name": "` + marker + `", "match": {"path": {"prefix": "/marker"}},
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1000, "burst": 1000}},
 {"name": "streams", "limit_keys": ["header:x-tenant"], "algorithm": "concurrency",
  "algorithm_config": {"max_in_flight": ` + strconv.Itoa(n) + `}}]}`
}

// TestConcurrencyDrainAndReload: on Envoy 1.40, both builds, requests in
// flight across (a) a reload of the filter's configuration that changes
// the rule's max_in_flight (a listener update) and (b) the listener's
// removal (its connections drained), then the listener back: every slot
// comes back (in_flight 0, slots_lost 0), and the key has exactly its N
// slots afterwards, none leaked and none doubled.
func TestConcurrencyDrainAndReload(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testConcurrencyDrainAndReload)
}

func testConcurrencyDrainAndReload(t *testing.T, build envoytest.Build) {
	t.Parallel()
	r := &reconfigEnv{t: t, version: 1}
	r.e = envoytest.Start(t, envoytest.Options{Build: build, LDS: true, PluginConfig: drainConfig(2, "marker1"),
		UpstreamPort: holdingUpstream(t), Concurrency: 2,
		// Connections of a listener updated or removed are closed 2 s
		// after, requests in flight or not.
		ExtraArgs: []string{"--drain-time-s", "2", "--drain-strategy", "immediate"}})
	e := r.e
	e.WaitStat("listener_manager.total_listeners_active", 1, 60*time.Second)
	inFlight := func() uint64 { return e.PluginStat("tokenbucket.rule.streams.in_flight") }

	// hold starts n requests of tenant held hold ms each, each on a
	// connection of its own, and returns a wait for their statuses (0:
	// the connection closed under it).
	hold := func(tenant string, n, holdMs int) func() []int {
		var wg sync.WaitGroup
		got := make([]int, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := e.Client()
				defer c.Close()
				res := c.Get("/", map[string]string{"x-tenant": tenant, "x-hold-ms": strconv.Itoa(holdMs)})
				if res.Err == nil {
					got[i] = res.Status
				}
			}()
		}
		return func() []int { wg.Wait(); return got }
	}
	// slots checks that tenant has exactly n slots now: n held requests
	// pass, the next is refused for concurrency, and all come back.
	slots := func(t *testing.T, tenant string, n int) {
		t.Helper()
		wait := hold(tenant, n, 1500)
		waitFor(t, strconv.Itoa(n)+" in flight", func() bool { return inFlight() == uint64(n) })
		c := e.Client()
		res := c.Get("/", map[string]string{"x-tenant": tenant})
		c.Close()
		if res.Status != 429 || res.Header.Get("X-Ratelimit-Reason") != "concurrency_limit_exceeded" {
			t.Fatalf("request %d of %s: %v %q; want 429 concurrency_limit_exceeded", n+1, tenant, res, res.Header.Get("X-Ratelimit-Reason"))
		}
		for _, s := range wait() {
			if s != 200 {
				t.Fatalf("a held request of %s: %d, want 200", tenant, s)
			}
		}
		waitFor(t, "nothing in flight", func() bool { return inFlight() == 0 })
	}
	settled := func(t *testing.T, what string) {
		t.Helper()
		waitFor(t, "nothing in flight after "+what, func() bool { return inFlight() == 0 })
		if lost := e.PluginStat("tokenbucket.slots_lost"); lost != 0 {
			t.Fatalf("slots_lost %d after %s", lost, what)
		}
	}

	// install writes the listener file with pluginConfig and waits until
	// the listener answers with it (its marker rule). Envoy's main thread
	// may build the filter (a Wasm VM) for seconds under load, its admin
	// silent meanwhile, so the test asks the listener itself, each time on
	// a new connection (one opened before stays with the old filter).
	install := func(t *testing.T, pluginConfig, marker string) {
		t.Helper()
		r.write(pluginConfig)
		deadline := time.Now().Add(90 * time.Second)
		for {
			c := e.Client()
			res := c.Get("/marker", nil)
			c.Close()
			if rlOf(res).rule == marker {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("configuration %s not in effect 90 s after it was written: GET /marker: %v", marker, res)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	slots(t, "r", 2)

	t.Run("reload with requests in flight", func(t *testing.T) {
		done := hold("r", 2, 1500)    // end after the update, on the old configuration
		cut := hold("r-cut", 2, 8000) // cut by the old filter chain's drain
		waitFor(t, "four in flight", func() bool { return inFlight() == 4 })
		install(t, drainConfig(3, "marker2"), "marker2")
		t.Logf("reload: held to the end %v, cut by the drain %v (0: closed)", done(), cut())
		settled(t, "the reload")
		slots(t, "r", 3)
		slots(t, "r-cut", 3)
	})

	t.Run("listener removed with requests in flight, then back", func(t *testing.T) {
		done := hold("d", 3, 1000)
		cut := hold("d-cut", 3, 8000)
		waitFor(t, "six in flight", func() bool { return inFlight() == 6 })
		removed := e.Stat("listener_manager.listener_removed") + 1
		r.version++
		if err := e.WriteLDSEmpty(strconv.Itoa(r.version)); err != nil {
			t.Fatal(err)
		}
		e.WaitStat("listener_manager.listener_removed", removed, 30*time.Second)
		t.Logf("drain: held to the end %v, cut by the drain %v (0: closed)", done(), cut())
		settled(t, "the drain")
		install(t, drainConfig(3, "marker3"), "marker3") // the listener back
		settled(t, "the listener's return")
		slots(t, "d", 3)
		slots(t, "d-cut", 3)
		slots(t, "r", 3)
	})
}
