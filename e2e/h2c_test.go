package e2e

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// burstCallouts is how many requests TestClusterBurstOverH2C sends at once:
// twice limitd's default --max-conns, so one connection per callout (what
// an HTTP/1.1 cluster without a connection bound opens) would not fit.
const burstCallouts = envoytest.MaxBurst

// TestClusterBurstOverH2C: one Envoy's 1,000 concurrent callouts for a
// fresh key of burst 1,000 (a per-request cluster rule, failure_mode deny)
// reach limitd (default --max-conns 512) over the harness's limit_service
// cluster, HTTP/2 with its circuit breakers sized against the cap: every
// request is admitted, none refused for want of a connection, and the
// callouts share a few connections.
func TestClusterBurstOverH2C(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testClusterBurstOverH2C)
}

func testClusterBurstOverH2C(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	// A generous callout timeout: on a loaded 2-core machine a timed-out
	// callout would be denied, and this test is about connections.
	cfg := `{"service": {"cluster": "limit_service", "timeout_ms": 8000, "failure_mode": "deny"},
	 "rules": [{"name": "burst", "scope": "cluster", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 1, "burst": ` + strconv.Itoa(burstCallouts) + `}}]}`
	e := envoytest.Start(t, envoytest.Options{Build: build, PluginConfig: cfg,
		UpstreamPort: up.Port(), ServicePort: svc, Concurrency: 2})
	c := e.Client()
	t.Cleanup(c.Close)
	key := "fresh-" + build.String() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	res := c.Burst(burstCallouts, func(int) *http.Request {
		return c.NewRequest("GET", "/", map[string]string{"x-api-key": key})
	})
	st := envoytest.Statuses(res)
	var slowest time.Duration
	for _, r := range res {
		slowest = max(slowest, r.Elapsed)
	}
	conns, h2 := e.Stat("cluster.limit_service.upstream_cx_total"), e.Stat("cluster.limit_service.upstream_cx_http2_total")
	t.Logf("%d concurrent: %v, slowest %v; limit_service connections %d (HTTP/2 %d), service errors %d",
		burstCallouts, st, slowest, conns, h2, e.PluginStat("tokenbucket.service_errors"))
	if st[200] != burstCallouts {
		for _, r := range res {
			if r.Status != 200 {
				t.Fatalf("statuses %v, want all %d admitted; first refused: %d %q reason %q (err %v)",
					st, burstCallouts, r.Status, r.Body, r.Header.Get("X-RateLimit-Reason"), r.Err)
			}
		}
	}
	if n := e.PluginStat("tokenbucket.service_errors"); n != 0 {
		t.Fatalf("%d failed calls to the service", n)
	}
	for _, s := range []string{"upstream_rq_pending_overflow", "upstream_cx_overflow", "upstream_rq_pending_failure_eject", "upstream_cx_destroy_remote_with_active_rq"} {
		if n := e.Stat("cluster.limit_service." + s); n != 0 {
			t.Errorf("cluster.limit_service.%s = %d, want 0", s, n)
		}
	}
	if h2 == 0 || h2 != conns {
		t.Errorf("limit_service: %d connections, %d of them HTTP/2; want all HTTP/2", conns, h2)
	}
}
