package e2e

import (
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// clusterSlotTTL is the slots' ttl_ms in these tests.
const clusterSlotTTL = 6 * time.Second

// clusterConcurrencyConfig allows four requests in flight per tenant
// across the fleet, the slots held by limitd.
var clusterConcurrencyConfig = `{"service": {"cluster": "limit_service", "timeout_ms": ` + strconv.Itoa(int(clusterTimeout.Milliseconds())) + `, "failure_mode": "deny"},
 "rules": [{"name": "streams", "scope": "cluster", "limit_keys": ["header:x-tenant"], "algorithm": "concurrency",
  "algorithm_config": {"max_in_flight": 4, "ttl_ms": ` + strconv.Itoa(int(clusterSlotTTL.Milliseconds())) + `}}]}`

// TestConcurrencyCluster: two Envoys (two workers each) through one limitd
// and a real redis-server share four slots per tenant exactly; a kill -9
// of one Envoy holding four slots frees them within the ttl (the figure is
// logged).
func TestConcurrencyCluster(t *testing.T) { forEachBuild(t, testConcurrencyCluster) }

func testConcurrencyCluster(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	envoys, ok := twoEnvoys(t, build, holdingUpstream(t), svc, [2]string{clusterConcurrencyConfig, clusterConcurrencyConfig})
	if !ok {
		return
	}
	a, b := envoys[0].Client(), envoys[1].Client()
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	held := func(tenant string, ms int) map[string]string {
		return map[string]string{"x-tenant": tenant, "x-hold-ms": strconv.Itoa(ms)}
	}

	t.Run("twelve at once over two Envoys: exactly four in flight", func(t *testing.T) {
		var res [2][]envoytest.Result
		var wg sync.WaitGroup
		for i, c := range []*envoytest.Client{a, b} {
			wg.Go(func() {
				res[i] = c.Burst(6, func(int) *http.Request { return c.NewRequest("GET", "/", held("shared", 3000)) })
			})
		}
		wg.Wait()
		st := envoytest.Statuses(append(res[0], res[1]...))
		if st[200] != 4 || st[429] != 8 {
			t.Fatalf("statuses %v (A %v, B %v), want exactly 4 admitted and 8 refused", st, envoytest.Statuses(res[0]), envoytest.Statuses(res[1]))
		}
		t.Logf("A %v, B %v", envoytest.Statuses(res[0]), envoytest.Statuses(res[1]))
	})

	t.Run("kill -9 of an Envoy holding four slots: freed within the ttl", func(t *testing.T) {
		// A holds four requests of tenant k (10 s each, the upstream's
		// most), and B is refused meanwhile.
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() { a.Do("GET", "/", held("k", 10_000)) })
		}
		t.Cleanup(wg.Wait)
		envoys[0].WaitPluginStat("tokenbucket.rule.streams.in_flight", 4, 10*time.Second)
		if r := b.Do("GET", "/", held("k", 0)); r.Status != 429 {
			t.Fatalf("B while A holds four: %d, want 429", r.Status)
		}
		killed := time.Now()
		if err := syscall.Kill(envoys[0].PID(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		envoys[0].Stop() // reaps it
		// Poll B every 100 ms, bounded: twice the ttl.
		var freed time.Duration
		for deadline := killed.Add(2 * clusterSlotTTL); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if r := b.Do("GET", "/", held("k", 0)); r.Status == 200 {
				freed = time.Since(killed)
				break
			}
		}
		if freed == 0 || freed > clusterSlotTTL+2*time.Second {
			t.Fatalf("B admitted k %v after the kill (0: not within %v), want within the ttl %v", freed, 2*clusterSlotTTL, clusterSlotTTL)
		}
		t.Logf("slots freed %v after kill -9 (ttl %v; renewed at least every ttl/3 + 1 s)", freed.Round(10*time.Millisecond), clusterSlotTTL)
	})
}
