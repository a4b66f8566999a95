package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// refundAttackConfig: gateway A's per-request cluster rule (a fixed cost of
// 1, nothing to refund), 10 per second with a burst of 20 per key, sent to
// limitd with A's own token.
const refundAttackConfig = `{"service": {"cluster": "limit_service", "timeout_ms": 1000, "failure_mode": "deny", "token": "token-of-a"},
 "rules": [{"name": "per-request", "scope": "cluster", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 10, "burst": 20}}]}`

// TestRefundAttack: gateway B, holding only its own token, sends limitd a
// refund of 20 every 20 ms on gateway A's bucket (the key read from Redis,
// as a caller that has seen it would know it) while A, a real Envoy with
// the plugin, admits requests on a per-request cluster rule for 3 seconds.
// A's admissions stay within burst + rate × t: B can give back only what B
// took, and A's decisions hold nothing to refund.
func TestRefundAttack(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testRefundAttack)
}

func testRefundAttack(t *testing.T, build envoytest.Build) {
	const (
		rate, burst = 10.0, 20.0
		traffic     = 3 * time.Second
	)
	redis := redistest.Start(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("gw-a token-of-a\ngw-b token-of-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	svc := startLimitd(t, redis.Addr(), "--token-file", tokens)
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
		PluginConfig: refundAttackConfig, UpstreamPort: up.Port(), ServicePort: svc, Concurrency: 2})
	if t.Failed() || t.Skipped() {
		return
	}
	a := e.Client()
	t.Cleanup(a.Close)
	hdr := map[string]string{"x-api-key": "victim"}

	start := time.Now()
	admitted, refused := 0, 0
	count := func(r envoytest.Result) {
		switch r.Status {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
			refused++
		default:
			t.Fatalf("gateway A: status %d, err %v", r.Status, r.Err)
		}
	}
	count(a.Get("/", hdr))

	// The bucket's key, as limitd stored it: rl:{<tag>}:10/20:<key>.
	keys, err := redistest.Do(redis.Addr(), "KEYS", "rl:*")
	if err != nil {
		t.Fatal(err)
	}
	const limit = "}:10/20:"
	i := strings.Index(keys, limit)
	if strings.Count(keys, "\n") != 0 || i < 0 {
		t.Fatalf("want one bucket of 10/20 in Redis, got %q", keys)
	}
	key := keys[i+len(limit):]

	// Gateway B: a refund of 20 on A's bucket every 20 ms until A is done.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var refunds, refundErrs int
	wg.Go(func() {
		body := `{"buckets":[{"key":` + strconv.Quote(key) + `,"tokens_per_second":10,"burst":20,"amount":-20}]}`
		hc := &http.Client{Timeout: 2 * time.Second}
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for n := 0; n < 1000; n++ { // bounded: 20 s of refunds at most
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			req, _ := http.NewRequest("POST", "http://127.0.0.1:"+strconv.Itoa(svc)+"/v1/charge", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer token-of-b")
			resp, err := hc.Do(req)
			if err != nil {
				refundErrs++
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				refunds++
			} else {
				refundErrs++
			}
		}
	})
	for n := 0; n < 5000 && time.Since(start) < traffic; n++ { // bounded either way
		count(a.Get("/", hdr))
	}
	elapsed := time.Since(start)
	close(stop)
	wg.Wait()

	bound := burst + rate*elapsed.Seconds()
	t.Logf("gateway A: %d admitted, %d refused in %v (bound burst + rate × t = %.1f); gateway B: %d refunds of 20 answered 200, %d failed",
		admitted, refused, elapsed.Round(time.Millisecond), bound, refunds, refundErrs)
	if refunds == 0 {
		t.Fatalf("gateway B's refunds never reached limitd (%d failed)", refundErrs)
	}
	if float64(admitted) > bound+1 {
		t.Errorf("gateway A admitted %d of %d requests, over burst + rate × t = %.1f: gateway B's refunds lifted A's limit", admitted, admitted+refused, bound)
	}
}
