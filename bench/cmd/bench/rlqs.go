// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

// The RLQS section (issue 32): stock Envoy with its own quota filter
// (envoy.filters.http.rate_limit_quota) reporting to limitd's rate limit
// quota service on a redis-server of its own, beside Envoy with no filter
// and with its local_ratelimit, and beside the plugin's and the native
// module's cluster rules with leases through limitd (a redis-server each).
// No request is ever refused: the limits are out of every load's reach.
//
// What a run measures:
//
//   - rounds of saturation runs (the order reversed every other round),
//     Envoy pinned to its CPU with one worker: Envoy's CPU per request;
//   - for the quota filter and the two lease configurations, rlqsFractions
//     of its saturated throughput (median of the rounds) over
//     rlqsWindow each: an open loop at the lower rates, the closed loop at
//     1. Over each window, limitd's stream messages (reports received,
//     responses and assignments sent, from its /metrics) or the Envoy's
//     lease calls (its /stats), and limitd's and its Redis's CPU
//     (/proc/<pid>/stat): per second and per 1,000 requests.
//
// Envoy 1.40's quota filter reports every 5 s whatever its
// reporting_interval says, so a window of 60 s holds twelve reports (±1 at
// its edges), and limitd's few milliseconds of CPU a second come to tens of
// the kernel's 10 ms ticks.

// The RLQS section's configurations.
var rlqsConfigs = []rlsConfig{
	{50, "rlqs-none", "Envoy, no filter", rlsNone, ""},
	{51, "rlqs-local", "Envoy's local_ratelimit", rlsLocal, ""},
	{52, "rlqs-quota", "Envoy's rate_limit_quota → limitd (RLQS)", rlsQuota, "token_bucket"},
	{53, "rlqs-plugin-lease", "plugin, cluster rule with leases → limitd (one hot key)", rlsLease, "token_bucket"},
	{54, "rlqs-module-lease", "native module, cluster rule with leases → limitd (one hot key)", rlsModuleLease, "token_bucket"},
	{rlqsFloorID, "rlqs-quota-allow", "Envoy's rate_limit_quota → limitd, every bucket ALLOW_ALL (the filter's floor)", rlsQuota, "token_bucket"},
}

// rlqsFloorID is the configuration that measures what Envoy's quota filter
// costs of itself: the same filter, the same stream and the same buckets as
// (52), but limitd's limit is unlimited, so every assignment is a blanket
// ALLOW_ALL and Envoy keeps no token bucket. (52) ÷ (55) is what dividing the
// rate into token buckets adds; (55) ÷ (51) what the filter's own matching,
// bucket ids and reports cost beside local_ratelimit, which no answer of
// limitd's changes. Its rate points are not measured: it asks limitd what
// (52) asks.
const rlqsFloorID = 55

// rlqsFractions are the rate points, fractions of a configuration's
// saturated throughput (1: the closed loop itself), and rlqsWindow (full
// runs) and rlqsSmokeWindow (-smoke) the length of each.
var rlqsFractions = []float64{0.1, 0.5, 1}

const (
	rlqsWindow      = 60 * time.Second
	rlqsSmokeWindow = 6 * time.Second
	// rlqsAwaitFor bounds the wait for the quota filter's first
	// assignments, one per key.
	rlqsAwaitFor = 60 * time.Second
)

// The quota filter's limit: every x-api-key value its own bucket of
// rlqsRate a second, written plain (no burst extension: a burst of one
// second of the rate, as envoyproxy/ratelimit's YAML gives), which no load
// reaches.
const (
	rlqsRate  = 1000000
	rlqsBurst = rlqsRate
	rlqsYAML  = `domain: ` + rlsDomain + `
descriptors:
  - key: api_key
    rate_limit:
      unit: second
      requests_per_unit: 1000000
`
	// rlqsAllowYAML is (55)'s: the same descriptor, unlimited.
	rlqsAllowYAML = `domain: ` + rlsDomain + `
descriptors:
  - key: api_key
    rate_limit:
      unlimited: true
`
)

// rlqsFilter is Envoy's quota filter of the section: the bucket id
// {api_key: <x-api-key>}, denying a bucket's requests before its first
// assignment and after one expires, so that every request it admits was
// admitted under an assignment of limitd's.
func rlqsFilter() *envoy.RateLimitQuota {
	return &envoy.RateLimitQuota{Domain: rlsDomain, Headers: []envoy.BucketHeader{{Key: "api_key", Header: "x-api-key"}},
		ReportingInterval: time.Second, NoAssignment: "DENY_ALL", Expired: "DENY_ALL"}
}

// The counters a rate point reads: limitd's for the quota filter, the
// Envoy's lease calls for the lease configurations.
var (
	rlqsMetrics = []string{"limitd_rlqs_reports_total", "limitd_rlqs_responses_total", "limitd_rlqs_assignments_total", "limitd_rlqs_store_calls_total"}
	moduleLease = envoy.Native.StatPrefix() + "tokenbucket.lease_calls"
)

// ratePoint is one window at a fixed rate (Fraction < 1, an open loop) or
// saturated (Fraction 1, the closed loop).
type ratePoint struct {
	Fraction float64 `json:"fraction_of_saturation"`
	Offered  float64 `json:"offered_rps,omitempty"`
	Achieved float64 `json:"achieved_rps"`
	Requests int64   `json:"requests"`
	Seconds  float64 `json:"seconds"`
	Rejected float64 `json:"rejected_fraction"`
	Errors   int64   `json:"errors"`
	// Calls are the limitd calls in the window: reports received for the
	// quota filter, lease calls for the others; Responses and
	// Assignments what limitd sent on the quota stream, StoreCalls its
	// lease calls to Redis for it.
	Calls       float64 `json:"calls"`
	Responses   float64 `json:"responses,omitempty"`
	Assignments float64 `json:"assignments,omitempty"`
	StoreCalls  float64 `json:"store_calls,omitempty"`
	ServiceCPU  float64 `json:"service_cpu_seconds"`
	RedisCPU    float64 `json:"redis_cpu_seconds"`
}

// PerSecond is x over the window, a second.
func (p ratePoint) PerSecond(x float64) float64 {
	if p.Seconds <= 0 {
		return 0
	}
	return x / p.Seconds
}

// Per1000 is x per 1,000 requests answered in the window.
func (p ratePoint) Per1000(x float64) float64 {
	if p.Requests == 0 {
		return 0
	}
	return 1000 * x / float64(p.Requests)
}

// rlqsRun measures the RLQS section into b.rlqs.
func (b *bench) rlqsRun() error {
	p := b.p
	started := time.Now()
	window := rlqsWindow
	if p.smoke {
		window = rlqsSmokeWindow
	}
	b.rlqs = &rlqsReport{Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), LoadStart: loadAvg(),
		Rounds: p.rounds, Keys: p.keys, Conns: p.conns, OpenConns: p.openConns, Warmup: p.warmup.String(),
		SatWindow: p.satWindow.String(), RateWindow: window.String(), Fractions: rlqsFractions, Smoke: p.smoke,
		Pinning: b.info.Pinning, Rate: rlqsRate, Burst: rlqsBurst}
	configs := rlqsConfigs
	if p.rlqsRatio {
		configs = nil
		for _, c := range rlqsConfigs {
			if c.Kind == rlsNone || c.Kind == rlsLocal || c.Kind == rlsQuota {
				configs = append(configs, c)
			}
		}
	}
	targets, err := b.rlsStartAll("rlqs", configs, rlsTools{limitd: p.limitd, module: p.module}, &b.rlqs.Redis, &b.rlqs.Limitd, &b.rlqs.Gaps)
	if err != nil {
		return err
	}
	for _, t := range targets {
		if t.c.Kind == rlsQuota && t.c.ID != rlqsFloorID {
			b.rlqs.Denied = t.denied
		}
	}
	for r := range p.rounds {
		for _, t := range roundOrder(targets, r) {
			s, err := saturate(b.rlsAddr(t), b.rlsProbe(t), b.reqs, p.conns, p.warmup, p.satWindow)
			if err != nil {
				return err
			}
			t.sat = append(t.sat, s)
			b.logf("rlqs round %d (%d) %s: %.0f req/s, Envoy %.1f µs/req, service %.1f µs/req",
				r+1, t.c.ID, t.c.Label, s.Throughput, s.CPUPerReqUS, perReq(s, 0))
		}
	}
	for _, t := range targets {
		if t.c.Kind == rlsNone || t.c.Kind == rlsLocal || t.c.ID == rlqsFloorID || p.rlqsRatio {
			continue
		}
		var thr []float64
		for _, s := range t.sat {
			thr = append(thr, s.Throughput)
		}
		full := max(spreadOf(thr).Median, 100)
		pr := b.rlsProbe(t)
		pr.counters = b.rlqsCounters(t)
		for _, frac := range rlqsFractions {
			pt := ratePoint{Fraction: frac}
			var watched, counters []float64
			if frac >= 1 {
				s, err := saturate(b.rlsAddr(t), pr, b.reqs, p.conns, p.warmup, window)
				if err != nil {
					return err
				}
				pt.Achieved, pt.Requests, pt.Rejected, pt.Errors = s.Throughput, s.Requests, s.Rejected, s.Errors
				watched, counters = s.Watched, s.Counters
			} else {
				pt.Offered = frac * full
				l, err := fixedRate(b.rlsAddr(t), pr, b.reqs, p.openConns, pt.Offered, p.warmup, window)
				if err != nil {
					return err
				}
				pt.Achieved, pt.Rejected, pt.Errors = l.Achieved, l.Rejected, l.Errors
				pt.Requests = int64(l.Achieved*window.Seconds() + 0.5)
				watched, counters = l.Watched, l.Counters
			}
			pt.Seconds = window.Seconds()
			if len(watched) == 2 {
				pt.ServiceCPU, pt.RedisCPU = watched[0], watched[1]
			}
			if len(counters) > 0 {
				pt.Calls = counters[0]
			}
			if len(counters) == len(rlqsMetrics) {
				pt.Responses, pt.Assignments, pt.StoreCalls = counters[1], counters[2], counters[3]
			}
			t.points = append(t.points, pt)
			b.logf("rlqs rate (%d) %s at %.0f%%: %.0f req/s, %.0f calls (%.3f/1000 req, %.2f/s), limitd %.1f ms/s",
				t.c.ID, t.c.Label, 100*frac, pt.Achieved, pt.Calls, pt.Per1000(pt.Calls), pt.PerSecond(pt.Calls), 1000*pt.PerSecond(pt.ServiceCPU))
		}
	}
	for _, t := range targets {
		if t.stats, err = t.envoy.Stats(""); err != nil {
			return err
		}
		if t.c.Kind == rlsQuota {
			if t.metrics, err = b.limitdMetrics(t); err != nil {
				return err
			}
		}
	}
	b.rlqs.LoadEnd = loadAvg()
	b.rlqs.Duration = time.Since(started).Round(time.Second).String()
	return b.rlqs.summarise(targets)
}

// rlqsCounters reads what t's rate points count: limitd's stream messages
// for the quota filter, the Envoy's lease calls for a lease configuration.
func (b *bench) rlqsCounters(t *rlsTarget) func() ([]float64, error) {
	switch t.c.Kind {
	case rlsQuota:
		return func() ([]float64, error) {
			m, err := b.limitdMetrics(t)
			if err != nil {
				return nil, err
			}
			out := make([]float64, len(rlqsMetrics))
			for i, name := range rlqsMetrics {
				v, ok := m[name]
				if !ok {
					return nil, fmt.Errorf("bench: limitd's /metrics has no %s", name)
				}
				out[i] = v
			}
			return out, nil
		}
	default:
		stat := leaseCallsStat
		if t.c.Kind == rlsModuleLease {
			stat = moduleLease
		}
		return func() ([]float64, error) {
			v, _, err := t.envoy.Stat(stat)
			return []float64{float64(v)}, err
		}
	}
}

// limitdMetrics reads t's limitd's /metrics.
func (b *bench) limitdMetrics(t *rlsTarget) (map[string]float64, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}
	resp, err := hc.Get("http://127.0.0.1:" + strconv.Itoa(t.svcHTTP) + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("bench: limitd's /metrics: %w", err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsBytes))
	if err != nil {
		return nil, fmt.Errorf("bench: limitd's /metrics: %w", err)
	}
	return parseMetrics(text), nil
}

// maxMetricsBytes bounds what is read of limitd's /metrics (a few KiB).
const maxMetricsBytes = 1 << 20

// parseMetrics reads Prometheus's text format: each sample line without
// labels ("name value") into name → value; comments, labelled series and
// lines that do not parse are left out.
func parseMetrics(text []byte) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || strings.ContainsRune(line, '{') {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			continue
		}
		out[fields[0]] = v
	}
	return out
}

// rlqsAwait waits until the quota filter of t admits a request of every
// key, so that every bucket has its first assignment before anything is
// measured, and counts in t.denied the requests refused before (the filter
// denies a bucket without an assignment: proof that it enforces limitd's).
func (b *bench) rlqsAwait(t *rlsTarget) error {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}
	todo := map[int]bool{}
	for i := range b.p.keys {
		todo[i] = true
	}
	deadline := time.Now().Add(rlqsAwaitFor)
	for len(todo) > 0 {
		for i := range todo {
			req, err := http.NewRequest("GET", "http://"+b.rlsAddr(t)+"/bench", nil)
			if err != nil {
				return err
			}
			req.Host = "bench"
			req.Header.Set("x-api-key", "k"+strconv.Itoa(i))
			resp, err := hc.Do(req)
			if err != nil {
				return fmt.Errorf("bench: waiting for the first assignments: %w", err)
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				delete(todo, i)
			case http.StatusTooManyRequests:
				t.denied++
			default:
				return fmt.Errorf("bench: waiting for the first assignments: status %d", resp.StatusCode)
			}
		}
		if len(todo) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %d keys of %d had no assignment after %v:\n%s", len(todo), b.p.keys, rlqsAwaitFor, envoy.Tail(t.envoy.Log(), 20))
		}
		time.Sleep(100 * time.Millisecond) // waiting for limitd's answer to the first reports, bounded by rlqsAwaitFor
	}
	b.logf("rlqs (%d): every key's bucket assigned after %d requests denied", t.c.ID, t.denied)
	return nil
}

// rlqsOnly runs the RLQS section alone and puts it into the report in -out
// (a new one when there is none), whose page it rewrites.
func (b *bench) rlqsOnly() error {
	if err := b.rlqsRun(); err != nil {
		return err
	}
	if b.p.rlqsRatio {
		r := b.rlqs
		for _, pair := range [][2]int{{52, 51}, {rlqsFloorID, 51}, {52, rlqsFloorID}, {51, 50}} {
			s := r.cpuRatio(pair[0], pair[1])
			fmt.Printf("Envoy CPU per request (%d) ÷ (%d): %.2f (%.2f–%.2f, %d rounds)\n", pair[0], pair[1], s.Median, s.Min, s.Max, s.N)
		}
		fmt.Printf("load average %s at the start, %s at the end; %s\n", r.LoadStart, r.LoadEnd, r.Duration)
		return nil
	}
	return b.writeSection(b.rlqs.Duration, b.rlqs.LoadEnd, func(rep *report) { rep.RLQS = b.rlqs }, (*report).rlqsSummary)
}
