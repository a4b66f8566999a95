// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
)

// TestDifferentialPrometheus plays kindsScript through Envoy on
// envoyproxy/ratelimit with USE_PROMETHEUS=true (its statistics flushed
// every 100 ms to its Prometheus sink) and on limitd with fixed windows and
// --prometheus-listen, scrapes both, and demands the same
// ratelimit_service_rate_limit_* series (names, label names and values,
// values: those Envoy Gateway's dashboards read), the same count of
// ShouldRateLimit calls and a configuration load on both.
func TestDifferentialPrometheus(t *testing.T) {
	t.Parallel()
	comparePrometheus(t, nil, nil)
}

// TestDifferentialNearLimitRatio is TestDifferentialPrometheus with
// NEAR_LIMIT_RATIO=0.5 and --rls-near-limit-ratio 0.5: limits of 5 and 4
// are near past 2 hits rather than 4 and 3.
func TestDifferentialNearLimitRatio(t *testing.T) {
	t.Parallel()
	comparePrometheus(t, []string{"NEAR_LIMIT_RATIO=0.5"}, []string{"--rls-near-limit-ratio", "0.5"})
}

// comparePrometheus plays kindsScript on envoyproxy/ratelimit (refEnv
// added to its environment) and limitd with fixed windows (limitdArgs
// added), each serving its Prometheus series, and compares them.
func comparePrometheus(t *testing.T, refEnv, limitdArgs []string) {
	t.Helper()
	refPort, limitdPort := freePort(t), freePort(t)
	ref := flavour{name: "envoyproxy-ratelimit", kind: reference, window: true, args: append([]string{"STATS_FLUSH_INTERVAL=100ms",
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:" + strconv.Itoa(refPort), "PROMETHEUS_PATH=/metrics"}, refEnv...)}
	lim := flavour{name: "limitd-fixed-window", kind: limitd, window: true, args: append([]string{"--rls-algorithm", "fixed_window",
		"--prometheus-listen", "127.0.0.1:" + strconv.Itoa(limitdPort)}, limitdArgs...)}
	sides := startSides(t, map[string]string{"kinds.yaml": kindsYAML},
		envoy.RateLimit{Domain: "kinds", FailureModeDeny: true, RouteRateLimits: kindsRateLimits}, ref, lim)
	var got [][][]seen
	inOneWindow(t, redisesOf(sides), func() { got, _ = lockstep(sides, kindsScript) })
	for i := range sides {
		checkStatuses(t, sides[i].f, kindsScript, got[i])
	}
	refURL := "http://127.0.0.1:" + strconv.Itoa(refPort) + "/metrics"
	refSeries := settledSeries(t, refURL)
	limitdSeries := scrapeSeries(t, "http://127.0.0.1:"+strconv.Itoa(limitdPort)+"/metrics")
	pick := func(lines []string, prefix string) []string {
		var out []string
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				out = append(out, l)
			}
		}
		return out
	}
	a, b := pick(refSeries, "ratelimit_service_rate_limit_"), pick(limitdSeries, "ratelimit_service_rate_limit_")
	if len(a) == 0 || !slices.Equal(a, b) {
		t.Errorf("ratelimit_service_rate_limit_* series differ:\nenvoyproxy/ratelimit:\n%s\nlimitd:\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
	t.Logf("%d series compared:\n%s", len(a), strings.Join(a, "\n"))
	calls := `ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} ` + strconv.Itoa(countRequests(kindsScript))
	for i, lines := range [][]string{refSeries, limitdSeries} {
		for _, want := range []string{calls, "ratelimit_service_config_load_success 1"} {
			if !slices.Contains(lines, want) {
				t.Errorf("%s: no %s in:\n%s", sides[i].label, want, strings.Join(pick(lines, "ratelimit_service_"), "\n"))
			}
		}
	}
	if t.Failed() {
		t.Logf("envoyproxy/ratelimit's log tail:\n%s", logtext.Tail(sides[0].s.log(), 20))
	}
}

// scrapeSeries is the sample lines (no comments) of a Prometheus scrape.
func scrapeSeries(t *testing.T, url string) []string {
	t.Helper()
	c := &http.Client{Timeout: callTimeout}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// settledSeries scrapes url until two scrapes a second apart have the same
// ratelimit_service_ series, some of them (envoyproxy/ratelimit sends its
// statistics to its sink every flush interval), within waitTimeout.
func settledSeries(t *testing.T, url string) []string {
	t.Helper()
	var last []string
	for deadline := time.Now().Add(waitTimeout); ; time.Sleep(time.Second) {
		cur := scrapeSeries(t, url)
		var svc []string
		for _, l := range cur {
			if strings.HasPrefix(l, "ratelimit_service_") {
				svc = append(svc, l)
			}
		}
		if len(svc) > 0 && slices.Equal(svc, last) {
			return cur
		}
		last = svc
		if time.Now().After(deadline) {
			t.Fatalf("%s: not settled within %v", url, waitTimeout)
		}
	}
}
