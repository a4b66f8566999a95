package e2e

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// lineConfig: one request in flight per tenant, the others waiting up to
// 20 s for the slot, at most 16 of a tenant at once.
const lineConfig = `{"rules": [{"name": "one", "limit_keys": ["header:x-tenant"], "algorithm": "concurrency",
  "algorithm_config": {"max_in_flight": 1, "max_delay_ms": 20000, "max_waiting": 16}}]}`

// TestConcurrencyLineAcrossWorkers: on Envoy 1.40 with four workers, both
// builds. (a) Waiters that came one after another, each on a connection
// of its own (so on workers the kernel picks), get the slot in the order
// they came. (b) A flood of waiters on one key from many connections, half
// of them hanging up while they wait, is bounded by max_waiting, and once
// it is over the key's line is empty: a new request goes on at once.
func TestConcurrencyLineAcrossWorkers(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testConcurrencyLineAcrossWorkers)
}

func testConcurrencyLineAcrossWorkers(t *testing.T, build envoytest.Build) {
	t.Parallel()
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
		PluginConfig: lineConfig, UpstreamPort: holdingUpstream(t), Concurrency: 4})
	stat := func(name string) uint64 { return e.PluginStat("tokenbucket.rule.one." + name) }
	get := func(ctx context.Context, h map[string]string) envoytest.Result {
		c := e.Client()
		defer c.Close()
		return c.DoRequest(c.NewRequest("GET", "/", h).WithContext(ctx))
	}

	t.Run("first come first served across workers", func(t *testing.T) {
		const waiters = 8
		first := make(chan envoytest.Result, 1)
		go func() { first <- get(context.Background(), map[string]string{"x-tenant": "fifo", "x-hold-ms": "1000"}) }()
		waitFor(t, "the slot taken", func() bool { return stat("in_flight") == 1 })
		var order []int
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range waiters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := get(context.Background(), map[string]string{"x-tenant": "fifo", "x-hold-ms": "100"})
				mu.Lock()
				defer mu.Unlock()
				if r.Status != 200 {
					t.Errorf("waiter %d: %v, want 200", i, r)
				}
				order = append(order, i)
			}()
			waitFor(t, "waiter "+strconv.Itoa(i)+" in the line", func() bool { return stat("waiting") == uint64(i+1) })
		}
		wg.Wait()
		if f := <-first; f.Status != 200 {
			t.Fatalf("first: %v", f)
		}
		for i, w := range order {
			if w != i {
				t.Fatalf("waiters served in the order %v, want the order they came", order)
			}
		}
	})

	t.Run("a flood of waiters with hang-ups leaves no line", func(t *testing.T) {
		const clients, perClient = 48, 10
		budget := time.Now().Add(30 * time.Second)
		var peak atomic.Uint64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() { // the waiting gauge, sampled while the flood runs
			defer close(sampled)
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				if w := stat("waiting"); w > peak.Load() {
					peak.Store(w)
				}
			}
		}()
		var statuses [600]atomic.Int64
		var wg sync.WaitGroup
		for w := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				for range perClient {
					if time.Now().After(budget) {
						return
					}
					ctx, cancel := context.WithCancel(context.Background())
					if rng.IntN(2) == 0 { // hangs up while it waits
						ctx, cancel = context.WithTimeout(ctx, time.Duration(5+rng.IntN(100))*time.Millisecond)
					}
					r := get(ctx, map[string]string{"x-tenant": "flood", "x-hold-ms": strconv.Itoa(rng.IntN(30))})
					cancel()
					if r.Err == nil && r.Status < len(statuses) {
						statuses[r.Status].Add(1)
					}
				}
			}()
		}
		wg.Wait()
		close(stop)
		<-sampled
		t.Logf("flood: 200 %d, 429 %d; waiting at most %d (sampled); waiting_full %d, delay_abandoned %d",
			statuses[200].Load(), statuses[429].Load(), peak.Load(), stat("waiting_full"), stat("delay_abandoned"))
		// max_waiting per worker and per key: 16 at most over the workers.
		if p := peak.Load(); p > 16 {
			t.Fatalf("%d waiting at once, max_waiting 16", p)
		}
		waitFor(t, "nothing waiting nor in flight", func() bool { return stat("waiting") == 0 && stat("in_flight") == 0 })
		if lost := e.PluginStat("tokenbucket.slots_lost"); lost != 0 {
			t.Fatalf("slots_lost %d", lost)
		}
		// The line is empty: a newcomer goes on at once, on any worker.
		for i := range 8 {
			r := get(context.Background(), map[string]string{"x-tenant": "flood"})
			if r.Status != 200 || r.Header.Get("X-Ratelimit-Delayed-Ms") != "" {
				t.Fatalf("request %d after the flood: %v, delayed %q ms; want 200 at once", i, r, r.Header.Get("X-Ratelimit-Delayed-Ms"))
			}
		}
	})
}
