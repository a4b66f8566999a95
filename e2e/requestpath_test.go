package e2e

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// TestTierMemberWithoutKey (issue 10, defect 1) on real Envoy: a request
// that matches the enterprise member but lacks its key is limited by the
// next member of the tier, not exempted from the tier.
func TestTierMemberWithoutKey(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testTierMemberWithoutKey)
}

func testTierMemberWithoutKey(t *testing.T, build envoytest.Build) {
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML, UpstreamPort: up.Port(), Concurrency: 2,
		PluginConfig: `{"rules": [
		  {"name": "enterprise", "group": "plan", "match": {"header:x-plan": {"equals": "enterprise"}}, "limit_keys": ["header:x-user"],
		   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1000, "burst": 1000}},
		  {"name": "free", "group": "plan", "limit_keys": ["header:x-user"], "missing_key": "shared",
		   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 3}}]}`})
	c := e.Client()
	t.Cleanup(c.Close)
	var st []int
	for range 6 {
		st = append(st, c.Get("/", map[string]string{"x-plan": "enterprise"}).Status)
	}
	if want := []int{200, 200, 200, 429, 429, 429}; !slices.Equal(st, want) {
		t.Fatalf("enterprise plan without x-user: %v, want the free tier's burst of 3 (%v)", st, want)
	}
	if r := c.Get("/", map[string]string{"x-plan": "enterprise", "x-user": "alice"}); r.Status != 200 || r.Header.Get("ratelimit-policy") != `"enterprise";q=1000;w=1` {
		t.Fatalf("enterprise with x-user: %d %q", r.Status, r.Header.Get("ratelimit-policy"))
	}
}

// TestShadowClusterRule (issue 10, defect 5) on real Envoy: two Envoys share
// limitd and Redis; a shadow cluster rule with burst 2 sees two requests at
// each Envoy. All four pass, and the two Envoys' shadow_rejected counters
// sum to 2: the one fleet-wide bucket decided, not each Envoy's own table.
func TestShadowClusterRule(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testShadowClusterRule)
}

func testShadowClusterRule(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	cfg := `{"service": {"cluster": "limit_service", "timeout_ms": 1000},
	  "rules": [{"name": "trial", "mode": "shadow", "scope": "cluster", "limit_keys": ["header:x-api-key"],
	   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 2}}]}`
	var envoys [2]*envoytest.Envoy
	var wg sync.WaitGroup
	for i := range envoys {
		wg.Add(1)
		go func() { // boot both at once: V8 compiles the plugin for seconds
			defer wg.Done()
			envoys[i] = envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
				PluginConfig: cfg, UpstreamPort: up.Port(), ServicePort: svc, Concurrency: 2})
		}()
	}
	wg.Wait()
	if t.Failed() || t.Skipped() {
		return
	}
	for _, e := range envoys {
		c := e.Client()
		for i := range 2 {
			if r := c.Get("/", map[string]string{"x-api-key": "k"}); r.Status != 200 || r.Header.Get("ratelimit") != "" {
				t.Fatalf("request %d: %d, ratelimit %q: a shadow rule must never reject nor add headers", i, r.Status, r.Header.Get("ratelimit"))
			}
		}
		c.Close()
	}
	// The answers are counted when they arrive, after the responses.
	const name = "tokenbucket.rule.trial.shadow_rejected"
	deadline := time.Now().Add(5 * time.Second)
	for {
		rej := envoys[0].PluginStat(name) + envoys[1].PluginStat(name)
		decided := rej + envoys[0].PluginStat("tokenbucket.rule.trial.allowed") + envoys[1].PluginStat("tokenbucket.rule.trial.allowed")
		if decided == 4 {
			if rej != 2 {
				t.Fatalf("shadow_rejected sums to %d over both Envoys, want 2", rej)
			}
			break
		}
		if time.Now().After(deadline) {
			for i, e := range envoys {
				t.Logf("Envoy %d: service_errors %d", i, e.PluginStat("tokenbucket.service_errors"))
			}
			t.Fatalf("after 5 s, %d of 4 shadow decisions counted", decided)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, e := range envoys {
		if n := e.PluginStat("tokenbucket.service_errors"); n != 0 {
			t.Fatalf("%d failed calls to the service", n)
		}
	}
}

// TestCookieAsUpstreamsSeeIt (issue 10, defect 8) on real Envoy: an
// exhausted session stays limited when the client writes "sid =victim" or
// splits its cookies over two Cookie headers.
func TestCookieAsUpstreamsSeeIt(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testCookieAsUpstreamsSeeIt)
}

func testCookieAsUpstreamsSeeIt(t *testing.T, build envoytest.Build) {
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML, UpstreamPort: up.Port(), Concurrency: 2,
		PluginConfig: `{"rules": [{"name": "session", "limit_keys": ["cookie:sid"],
		  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 2}}]}`})
	c := e.Client()
	t.Cleanup(c.Close)
	for range 2 {
		c.Get("/", map[string]string{"cookie": "sid=victim"})
	}
	for name, cookies := range map[string][]string{
		"space before =":       {"sid =victim"},
		"second Cookie header": {"theme=dark", "sid=victim"},
	} {
		req := c.NewRequest("GET", "/", nil)
		for _, v := range cookies {
			req.Header.Add("Cookie", v)
		}
		if r := c.DoRequest(req); r.Status != 429 {
			t.Errorf("%s: %d, want 429 (the upstream reads sid=victim; upstream saw Cookie %q)", name, r.Status, up.LastHeader().Values("Cookie"))
		}
	}
}
