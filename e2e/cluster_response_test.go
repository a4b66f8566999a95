package e2e

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// clusterResponseConfig: a fleet-wide budget of 100 per key whose cost, 30
// an answer, comes from the response's x-usage header (llmUpstream's
// /header), decided per request (/header) or spent from leases
// (/header-lease).
const clusterResponseConfig = `{"service": {"cluster": "limit_service", "timeout_ms": 1000},
 "rules": [
  {"name": "fleet", "scope": "cluster", "match": {"path": {"equals": "/header"}}, "limit_keys": ["header:x-api-key"],
   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 100,
   "cost_source": "response_header:x-usage"}},
  {"name": "fleet-lease", "scope": "cluster", "sync": "lease", "match": {"path": {"equals": "/header-lease"}},
   "limit_keys": ["header:x-api-key"],
   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 100,
   "cost_source": "response_header:x-usage"}}]}`

// limitdCounter reads one counter of limitd's /metrics.
func limitdCounter(t *testing.T, port int, name string) float64 {
	t.Helper()
	r, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			return f
		}
	}
	return 0
}

// TestClusterResponseCost: two Envoys share one limitd and one Redis; a
// cluster rule's budget of 100 per key, with answers costing 30 (1
// reserved, 29 charged after the response), admits exactly 4 requests
// across both Envoys before the first 429.
func TestClusterResponseCost(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testClusterResponseCost)
}

func testClusterResponseCost(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	up := startLLMUpstream(t)
	envoys, ok := twoEnvoys(t, build, up.port(t), svc, [2]string{clusterResponseConfig, clusterResponseConfig})
	if !ok {
		return
	}
	clients := [2]*envoytest.Client{envoys[0].Client(), envoys[1].Client()}
	for _, c := range clients {
		t.Cleanup(c.Close)
	}
	for _, path := range []string{"/header", "/header-lease"} {
		t.Run(path, func(t *testing.T) {
			var statuses []int
			for i := 0; i < 6; i++ {
				r := clients[i%2].Do("POST", path, map[string]string{"x-api-key": "team"})
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				statuses = append(statuses, r.Status)
				if r.Status != 200 {
					continue
				}
				// A charge goes to limitd after the response: wait until
				// every charge call the Envoys sent has landed before the
				// next request (the wait only orders the two; no sleep
				// decides the outcome).
				deadline := time.Now().Add(10 * time.Second)
				for {
					sent := envoys[0].PluginStat("tokenbucket.charge_calls") + envoys[1].PluginStat("tokenbucket.charge_calls")
					if limitdCounter(t, svc, "limitd_charges_total") >= float64(sent) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("request %d: %d charge calls sent, not all reached limitd", i, sent)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			if got, want := statuses, []int{200, 200, 200, 200, 429, 429}; !slicesEqual(got, want) {
				t.Fatalf("statuses %v, want %v", got, want)
			}
		})
	}
	for i, e := range envoys {
		if n := e.PluginStat("tokenbucket.service_errors"); n != 0 {
			t.Errorf("envoy %d: service_errors = %d", i, n)
		}
	}
}
