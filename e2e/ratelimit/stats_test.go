// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

// TestDifferentialStats plays kindsScript on envoyproxy/ratelimit (its
// statistics flushed every 100 ms) and on limitd with fixed windows, and
// compares what each counted for every descriptor: total hits, over limit,
// near limit, within limit and shadow mode, envoyproxy/ratelimit's
// ratelimit.service.rate_limit.<domain>.<descriptor>.<stat> against
// limitd's limitd_rls_<stat>_total{domain,descriptor} on /metrics.
func TestDifferentialStats(t *testing.T) {
	t.Parallel()
	ref := flavour{name: "envoyproxy-ratelimit", kind: reference, window: true, args: []string{"STATS_FLUSH_INTERVAL=100ms"}}
	sides := startSides(t, map[string]string{"kinds.yaml": kindsYAML},
		envoy.RateLimit{Domain: "kinds", FailureModeDeny: true, RouteRateLimits: kindsRateLimits}, ref, flavours[1])
	var got [][][]seen
	inOneWindow(t, redisesOf(sides), func() { got, _ = lockstep(sides, kindsScript) })
	for i := range sides {
		checkStatuses(t, sides[i].f, kindsScript, got[i])
	}
	const prefix = "ratelimit.service.rate_limit.kinds."
	refStats := sides[0].s.rl.WaitCountersSettled(prefix, 2*time.Second, waitTimeout)
	limitdStats := limitdCounters(sides[1].s.metrics(t), "kinds")
	if len(refStats) == 0 || len(limitdStats) == 0 {
		t.Fatalf("no statistics: envoyproxy/ratelimit %v, limitd %v", refStats, limitdStats)
	}
	names := map[string]bool{}
	for k := range refStats {
		names[strings.TrimPrefix(k, prefix)] = true
	}
	for k := range limitdStats {
		names[k] = true
	}
	compared := 0
	for _, name := range slices.Sorted(maps.Keys(names)) {
		a, b := refStats[prefix+name], limitdStats[name]
		if a == 0 && b == 0 {
			continue
		}
		compared++
		if a != b {
			t.Errorf("%s: envoyproxy/ratelimit %v, limitd %v", name, a, b)
		}
	}
	t.Logf("%d descriptor statistics compared", compared)
}

// limitdCounters reads limitd's per-descriptor series of domain from its
// /metrics text, named as envoyproxy/ratelimit names its statistics:
// "<descriptor>.<stat>" (total_hits, over_limit, near_limit, within_limit,
// shadow_mode).
func limitdCounters(metrics, domain string) map[string]float64 {
	m := map[string]float64{}
	for _, l := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(l, "limitd_rls_")
		if !ok {
			continue
		}
		stat, labels, ok := strings.Cut(rest, "_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(labels, "} ")
		if !ok || !strings.Contains(labels, `domain="`+domain+`"`) {
			continue
		}
		_, d, ok := strings.Cut(labels, `descriptor="`)
		if !ok {
			continue
		}
		d, _, _ = strings.Cut(d, `"`)
		v, err := strconv.ParseFloat(value, 64)
		if err == nil {
			m[d+"."+stat] = v
		}
	}
	return m
}
