package e2e

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// quotaLeaseLimit is the minute quota of TestQuotaClusterLease, and
// quotaLeaseHeld the most one Envoy's lease of it can hold unspent: a
// refill asks for the lease's size (at most max_share 0.25 × the limit)
// once the lease falls below half of it, so under one and a half sizes.
const (
	quotaLeaseLimit = 40
	quotaLeaseHeld  = quotaLeaseLimit / 4 * 3 / 2
)

// quotaLeaseConfig is a minute quota (UTC: it turns at second 0) in scope
// cluster with leases, per x-tenant. Its lease calls wait up to 5 s: the
// first requests of a minute all call at once, and a call that a loaded
// machine answers late would refuse its request (failure_mode deny).
func quotaLeaseConfig() string {
	return `{"service": {"cluster": "limit_service", "timeout_ms": ` + strconv.Itoa(int(clusterTimeout.Milliseconds())) + `, "lease_timeout_ms": 5000, "failure_mode": "deny"},
	 "rules": [{"name": "minutely", "scope": "cluster", "sync": "lease", "limit_keys": ["header:x-tenant"], "algorithm": "quota",
	  "algorithm_config": {"limit": ` + strconv.Itoa(quotaLeaseLimit) + `, "period": "minute"}}]}`
}

// TestQuotaClusterLease: two Envoys (two workers each; A the Wasm build, B
// the native module) lease from one minute quota of 40 through limitd and
// a real redis-server. 200 concurrent requests on one tenant within one
// wall-clock minute admit at most 40 and at least 40 less what two leases
// can hold unspent (2 × 15); after the minute turns (the test waits for
// the boundary it computes), the same burst finds a fresh 40: again at
// most 40, so nothing leased in the first minute was spent in the second.
// Each burst starts just after a boundary, so that a loaded machine has
// the minute to answer it.
func TestQuotaClusterLease(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	// limitd's bound on a decision matches the lease calls' 5 s: on a
	// loaded machine Redis may take over a second to answer the minute's
	// first calls, all at once, and a refused call would only test the load.
	svc := startLimitd(t, redis.Addr(), "--timeout", "5s")
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	envoys, a, b := startBothBuilds(t, quotaLeaseConfig(), up.Port(), svc)
	if envoys[0] == nil {
		return
	}
	// burst waits for the next minute (polling the clock, at most a
	// minute), sends 100 concurrent requests to each Envoy and returns the
	// statuses, once all came back within that minute.
	burst := func(what string) map[int]int {
		t.Helper()
		minute := time.Now().UTC().Truncate(time.Minute).Add(time.Minute)
		for deadline := minute.Add(10 * time.Second); time.Now().Before(minute.Add(100 * time.Millisecond)); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the clock did not reach the minute %v", minute)
			}
		}
		began := time.Now()
		var res [2][]envoytest.Result
		var wg sync.WaitGroup
		for i, c := range []*envoytest.Client{a, b} {
			wg.Go(func() {
				res[i] = c.Burst(100, func(int) *http.Request {
					return c.NewRequest("GET", "/", map[string]string{"x-tenant": "shared"})
				})
			})
		}
		wg.Wait()
		if end := time.Now().UTC().Truncate(time.Minute); !end.Equal(minute) {
			t.Fatalf("%s: the burst began in the minute %v and ended in %v (%v): the check needs one minute", what, minute, end, time.Since(began))
		}
		t.Logf("%s: the burst took %v", what, time.Since(began))
		st := envoytest.Statuses(append(res[0], res[1]...))
		if ok := st[200]; ok > quotaLeaseLimit || ok < quotaLeaseLimit-2*quotaLeaseHeld || st[200]+st[429] != 200 {
			t.Fatalf("%s: statuses %v (Envoy A %v, B %v; service errors %d, %d), want %d to %d admitted, the rest refused", what, st,
				envoytest.Statuses(res[0]), envoytest.Statuses(res[1]), envoys[0].PluginStat("tokenbucket.service_errors"),
				envoys[1].PluginStat("tokenbucket.service_errors"), quotaLeaseLimit-2*quotaLeaseHeld, quotaLeaseLimit)
		}
		return st
	}
	first := burst("first minute")
	second := burst("next minute")
	for _, e := range envoys {
		if n := e.PluginStat("tokenbucket.service_errors"); n != 0 {
			t.Fatalf("%d failed calls to the service", n)
		}
	}
	t.Logf("two Envoys, a minute quota of %d with leases: %d admitted in one minute, %d in the next; %d lease calls",
		quotaLeaseLimit, first[200], second[200], envoys[0].PluginStat("tokenbucket.lease_calls")+envoys[1].PluginStat("tokenbucket.lease_calls"))
}
