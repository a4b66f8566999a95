package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// quotaClusterConfig is an hour quota of 40 in Asia/Kathmandu (UTC+5:45:
// its hours turn at hh:15 UTC) in scope cluster, per x-tenant, per request.
func quotaClusterConfig() string {
	return `{"service": {"cluster": "limit_service", "timeout_ms": ` + strconv.Itoa(int(clusterTimeout.Milliseconds())) + `, "failure_mode": "deny"},
	 "rules": [{"name": "hourly", "scope": "cluster", "limit_keys": ["header:x-tenant"], "algorithm": "quota",
	  "algorithm_config": {"limit": 40, "period": "hour", "time_zone": "Asia/Kathmandu"}}]}`
}

// TestQuotaCluster: two Envoys (two workers each; one the Wasm build, one
// the native module) share an hour quota of 40 through limitd and one
// Redis: 300 concurrent requests on one tenant
// admit exactly 40; every answer's RateLimit t, and a refusal's
// Retry-After (jittered upward by up to a half), run to the next hh:15
// UTC; the quota's one Redis key expires a minute after that boundary.
func TestQuotaCluster(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	envoys, a, b := startBothBuilds(t, quotaClusterConfig(), up.Port(), svc)
	if envoys[0] == nil {
		return
	}
	const kathmandu = 15 * time.Minute
	awayFromBoundary(time.Hour, kathmandu, 30*time.Second)
	before := secondsTo(time.Now(), time.Hour, kathmandu)
	var res [2][]envoytest.Result
	var wg sync.WaitGroup
	for i, c := range []*envoytest.Client{a, b} {
		wg.Go(func() {
			res[i] = c.Burst(150, func(int) *http.Request {
				return c.NewRequest("GET", "/", map[string]string{"x-tenant": "shared"})
			})
		})
	}
	wg.Wait()
	after := secondsTo(time.Now(), time.Hour, kathmandu)
	all := append(res[0], res[1]...)
	st := envoytest.Statuses(all)
	if st[200] != 40 || st[429] != 260 {
		t.Fatalf("statuses %v (Envoy A %v, B %v), want exactly 40 admitted", st, envoytest.Statuses(res[0]), envoytest.Statuses(res[1]))
	}
	for _, e := range envoys {
		if n := e.PluginStat("tokenbucket.service_errors"); n != 0 {
			t.Fatalf("%d failed calls to the service during the burst", n)
		}
	}
	for _, r := range all {
		if h := r.Header.Get("RateLimit"); r.Status == 200 && !strings.HasPrefix(h, `"hourly";r=`) {
			t.Fatalf("admitted with RateLimit %q", h)
		} else if r.Status == 200 {
			within(t, "t", rateLimitT(t, h), before, after)
			continue
		}
		ra, err := strconv.ParseInt(r.Header.Get("Retry-After"), 10, 64)
		if err != nil || ra < min(before, after)-1 || ra > max(before, after)*3/2+1 {
			t.Fatalf("refused with Retry-After %q, want %d to %d (to the next hh:15 UTC, jittered)", r.Header.Get("Retry-After"), before, after*3/2)
		}
	}
	keys, err := redistest.Do(redis.Addr(), "KEYS", "rl:*")
	if err != nil {
		t.Fatal(err)
	}
	if ks := strings.Fields(keys); len(ks) != 1 || !strings.Contains(ks[0], ":0/40:") {
		t.Fatalf("Redis keys %q, want the quota's one key (rate 0, limit 40)", keys)
	}
	pttl, err := redistest.Do(redis.Addr(), "PTTL", strings.Fields(keys)[0])
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := strconv.ParseInt(strings.TrimSpace(pttl), 10, 64)
	left := secondsTo(time.Now(), time.Hour, kathmandu)
	if ms < (left-2)*1000+60_000 || ms > (left+1)*1000+60_000 {
		t.Fatalf("PTTL %s ms, want the boundary (%d s away) plus a minute", pttl, left)
	}
	t.Logf("two Envoys: %v; t and Retry-After to the boundary %d s away", st, after)
}

// startBothBuilds starts Envoy A (the Wasm build) and Envoy B (the native
// module) with two workers each, the plugin configuration cfg, the upstream
// and limitd on their ports, booted side by side (V8 compiles the plugin
// for seconds), and returns them with a client of each; nil Envoys when a
// start failed or was skipped.
func startBothBuilds(t *testing.T, cfg string, upstream, service int) ([2]*envoytest.Envoy, *envoytest.Client, *envoytest.Client) {
	t.Helper()
	var envoys [2]*envoytest.Envoy
	var boot sync.WaitGroup
	for i, build := range []envoytest.Build{envoytest.Wasm, envoytest.Native} {
		boot.Go(func() {
			envoys[i] = envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
				PluginConfig: cfg, UpstreamPort: upstream, ServicePort: service, Concurrency: 2})
		})
	}
	boot.Wait()
	if t.Failed() || t.Skipped() {
		return [2]*envoytest.Envoy{}, nil, nil
	}
	a, b := envoys[0].Client(), envoys[1].Client()
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	return envoys, a, b
}
