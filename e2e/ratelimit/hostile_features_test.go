// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

const churnYAML = `domain: hostile
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: churn
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// TestHostileFeatures runs limitd with response headers, dynamic metadata
// and envoyproxy/ratelimit's Prometheus series on, against what an
// attacker sends: a key not UTF-8 through Envoy (decided, the headers
// written), and from a client of its own 300 calls each naming a new
// 8,000-byte value of a detailed_metric descriptor (each a series of its
// own, the metadata echoing the value). The scrape stays bounded: every
// label of a name past --max-key-bytes is hashed.
func TestHostileFeatures(t *testing.T) {
	t.Parallel()
	promPort := freePort(t)
	s := startService(t, limitd, map[string]string{"hostile.yaml": churnYAML}, "--rls-algorithm", "fixed_window",
		"--rls-response-headers", "--rls-response-metadata", "--prometheus-listen", "127.0.0.1:"+strconv.Itoa(promPort))
	e := startEnvoy(t, s, envoy.RateLimit{Domain: "hostile",
		RouteRateLimits: envoy.RateLimitsYAML(envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-api-key", "api_key")}})})
	c := e.Client()
	defer c.Close()
	var problems []string
	inWindowOf(t, []*redistest.Server{s.redis}, time.Hour, func() bool {
		problems = problems[:0]
		for i, want := range []int{200, 200, 200, 429} {
			g := c.Get("/", map[string]string{"x-api-key": "\xff\xfe"})
			if g.Status != want || g.Header.Get("ratelimit-limit") != "3" || g.Header.Get("ratelimit-remaining") != strconv.Itoa(max(0, 2-i)) {
				problems = append(problems, fmt.Sprintf("a key not UTF-8, request %d: %d limit=%q remaining=%q, want %d 3 %d", i, g.Status,
					g.Header.Get("ratelimit-limit"), g.Header.Get("ratelimit-remaining"), want, max(0, 2-i)))
			}
		}
		return true
	})
	for _, p := range problems {
		t.Error(p)
	}

	const calls, size = 300, 8000
	for i := range calls {
		v := strconv.Itoa(i) + strings.Repeat("v", size)
		r, err := s.call("hostile", 1, entries{"churn", v})
		if err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v, %v", i, r.GetOverallCode(), err)
		}
		if d := r.GetDynamicMetadata().GetFields()["descriptors"].GetListValue().GetValues(); len(d) != 1 {
			t.Fatalf("call %d: metadata %d descriptors", i, len(d))
		}
	}
	lines := scrapeSeries(t, "http://127.0.0.1:"+strconv.Itoa(promPort)+"/metrics")
	churn, longest := 0, 0
	for _, l := range lines {
		if strings.HasPrefix(l, "ratelimit_service_rate_limit_total_hits{") && strings.Contains(l, `key1="churn_`) {
			churn++
		}
		longest = max(longest, len(l))
	}
	if churn != calls {
		t.Errorf("%d total_hits series of churn, want %d", churn, calls)
	}
	if longest > 1000 {
		t.Errorf("a series line of %d bytes: a long value's label is not bounded", longest)
	}
	t.Logf("%d series lines, the longest %d bytes", len(lines), longest)
}
