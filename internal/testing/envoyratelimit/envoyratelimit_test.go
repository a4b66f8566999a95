// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoyratelimit

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

const fiveAMinute = `domain: harness
descriptors:
  - key: k
    value: v
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// decide asks s once about harness/k=v through /json and returns the
// overall code ("OK" or "OVER_LIMIT").
func decide(t *testing.T, s *Server) string {
	t.Helper()
	code, body, err := s.JSON(`{"domain":"harness","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case strings.Contains(body, `"OVER_LIMIT"`) && code == 429:
		return "OVER_LIMIT"
	case strings.Contains(body, `"OK"`) && code == 200:
		return "OK"
	}
	t.Fatalf("/json = %d %s", code, body)
	return ""
}

// TestStartDecideReloadStop starts the real server on a real redis-server,
// takes a fixed window's limit, reloads a file under it and stops it.
func TestStartDecideReloadStop(t *testing.T) {
	r := redistest.Start(t)
	s := Start(t, Options{RedisAddr: r.Addr(), Configs: map[string]string{"limits.yaml": fiveAMinute},
		Env: []string{"STATS_FLUSH_INTERVAL=100ms"}})
	if got, err := s.LoadedConfig(); err != nil || !strings.Contains(got, "harness.k_v: unit=MINUTE requests_per_unit=5") {
		t.Fatalf("LoadedConfig() = %q, %v", got, err)
	}
	// Five a minute: the window may turn between two requests, so count
	// what six requests in a row get: at least one OK, and an OVER_LIMIT
	// unless a window edge fell inside.
	var over int
	for range 6 {
		if decide(t, s) == "OVER_LIMIT" {
			over++
		}
	}
	if over > 1 {
		t.Fatalf("six requests on a limit of 5 a minute: %d over the limit, want at most 1", over)
	}
	stats := s.WaitCountersSettled("ratelimit.service.rate_limit.harness.", time.Second, 30*time.Second)
	if got := stats["ratelimit.service.rate_limit.harness.k_v.total_hits"]; got != 6 {
		t.Errorf("counters %v: total_hits %v, want 6", stats, got)
	}
	if got := stats["ratelimit.service.rate_limit.harness.k_v.over_limit"]; got != float64(over) {
		t.Errorf("counters %v: over_limit %v, want %d", stats, got, over)
	}

	refused := len(s.ConfigErrors())
	if err := s.WriteConfig("limits.yaml", strings.Replace(fiveAMinute, "unit: minute", "unit: fortnight", 1)); err != nil {
		t.Fatal(err)
	}
	line, err := s.WaitRefused(refused, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(line, "limits.yaml") || !strings.Contains(line, "fortnight") {
		t.Errorf("refusal %q: want the file key and the bad unit", line)
	}
	if got, _ := s.LoadedConfig(); !strings.Contains(got, "requests_per_unit=5") {
		t.Errorf("after a refused file LoadedConfig() = %q, want the old limit kept", got)
	}

	loads := s.Loads()
	if err := s.WriteConfig("limits.yaml", strings.Replace(fiveAMinute, "requests_per_unit: 5", "requests_per_unit: 7", 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitLoads(loads+1, len(s.ConfigErrors()), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.LoadedConfig(); !strings.Contains(got, "requests_per_unit=7") {
		t.Errorf("after a reload LoadedConfig() = %q, want 7 a minute", got)
	}
	s.Stop()
	if !s.Exited() {
		t.Error("Stop: the server is still running")
	}
}

func TestStartServerNeedsRedis(t *testing.T) {
	if _, err := StartServer(Options{Binary: "/bin/true"}); err == nil || !strings.Contains(err.Error(), "RedisAddr") {
		t.Fatalf("StartServer without RedisAddr: %v, want an error naming RedisAddr", err)
	}
}

// TestEnvoyFilter runs Envoy 1.40's own rate limit filter against the
// server through the bootstrap's RateLimit switch: a route's descriptor on
// one Envoy; on another, the filter's own descriptors, one with its hits
// from a request header, and the x-ratelimit-* headers Envoy writes.
func TestEnvoyFilter(t *testing.T) {
	r := redistest.Start(t)
	s := Start(t, Options{RedisAddr: r.Addr(), Configs: map[string]string{"limits.yaml": `domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: weighted
    value: "yes"
    rate_limit: {unit: hour, requests_per_unit: 10}
`}})
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	apiKey := envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-api-key", "api_key")}}
	route := envoytest.Start(t, envoytest.Options{NoWasm: true, UpstreamPort: up.Port(), RLSPort: s.GRPCPort(), Concurrency: 2,
		RateLimit: &envoy.RateLimit{Domain: "edge", RouteRateLimits: envoy.RateLimitsYAML(apiKey)}})
	filter := envoytest.Start(t, envoytest.Options{NoWasm: true, UpstreamPort: up.Port(), RLSPort: s.GRPCPort(), Concurrency: 2,
		RateLimit: &envoy.RateLimit{Domain: "edge", FilterRateLimits: envoy.RateLimitsYAML(apiKey,
			envoy.Descriptor{Actions: []envoy.Action{envoy.GenericKey("weighted", "yes")}, HitsAddend: "%REQ(x-hits)%"})}})
	rc, fc := route.Client(), filter.Client()
	defer rc.Close()
	defer fc.Close()
	for attempt := 1; ; attempt++ {
		hour := time.Now().Truncate(time.Hour)
		var got []int
		for _, c := range []*envoytest.Client{rc, fc} {
			key := "k" + strconv.Itoa(attempt) + strconv.Itoa(len(got))
			for range 3 {
				got = append(got, c.Get("/", map[string]string{"x-api-key": key}).Status)
			}
		}
		res := fc.Get("/", map[string]string{"x-hits": "7"})
		heavy := fc.Get("/", map[string]string{"x-hits": "4"})
		if !time.Now().Truncate(time.Hour).Equal(hour) && attempt < 3 {
			continue // an hour's edge fell inside: the counts started again
		}
		if want := []int{200, 200, 429, 200, 200, 429}; !slices.Equal(got, want) {
			t.Errorf("x-api-key through the route's and the filter's rate limits: statuses %v, want %v", got, want)
		}
		if res.Status != 200 || res.Header.Get("x-ratelimit-limit") != "10, 10;w=3600" || res.Header.Get("x-ratelimit-remaining") != "3" {
			t.Errorf("7 hits of 10: %d %v", res.Status, res.Header)
		}
		if heavy.Status != 429 {
			t.Errorf("4 more hits of the 3 left: %d, want 429", heavy.Status)
		}
		break
	}
}

// TestVersionIsTheBuilt keeps Version, the version e2e/ratelimit's go.mod
// names, and the one `make build-ratelimit` builds (mk/ratelimit.mk) the
// same.
func TestVersionIsTheBuilt(t *testing.T) {
	for _, f := range []struct{ path, prefix string }{
		{"../../../mk/ratelimit.mk", "RATELIMIT_VERSION := "},
		{"../../../e2e/ratelimit/go.mod", "\tgithub.com/envoyproxy/ratelimit "},
	} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, f.prefix); ok {
				found = true
				if v, _, _ = strings.Cut(v, " "); v != Version {
					t.Errorf("%s: %q, want Version %s", f.path, line, Version)
				}
			}
		}
		if !found {
			t.Errorf("%s: no line %q...", f.path, f.prefix)
		}
	}
}
