// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestParseMetrics reads unlabelled samples and leaves out comments,
// labelled series and lines that do not parse.
func TestParseMetrics(t *testing.T) {
	text := []byte("# HELP limitd_rlqs_reports_total Usage reports received.\n" +
		"# TYPE limitd_rlqs_reports_total counter\n" +
		"limitd_rlqs_reports_total 119\n" +
		"limitd_rlqs_refused_streams_total{code=\"ResourceExhausted\"} 2\n" +
		"limitd_rlqs_leased_tokens_total 8.887603997e+09\n" +
		"  limitd_rlqs_streams 1  \n" +
		"broken\n" +
		"not_a_number x\n\n")
	got := parseMetrics(text)
	want := map[string]float64{"limitd_rlqs_reports_total": 119, "limitd_rlqs_leased_tokens_total": 8887603997, "limitd_rlqs_streams": 1}
	if len(got) != len(want) {
		t.Fatalf("parseMetrics = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// TestRatePointRates: per second over the window, per 1,000 requests
// answered, and 0 for an empty window.
func TestRatePointRates(t *testing.T) {
	p := ratePoint{Seconds: 60, Requests: 480000, Calls: 12}
	if got := p.PerSecond(p.Calls); got != 0.2 {
		t.Errorf("PerSecond = %v, want 0.2", got)
	}
	if got := p.Per1000(p.Calls); got != 0.025 {
		t.Errorf("Per1000 = %v, want 0.025", got)
	}
	if (ratePoint{}).PerSecond(3) != 0 || (ratePoint{}).Per1000(3) != 0 {
		t.Error("an empty window gave a rate")
	}
}

// TestDiff: counters' growth element by element, none when a read lacked
// one.
func TestDiff(t *testing.T) {
	if got := diff([]float64{1, 10}, []float64{4, 10}); len(got) != 2 || got[0] != 3 || got[1] != 0 {
		t.Errorf("diff = %v, want [3 0]", got)
	}
	if got := diff([]float64{1}, nil); got != nil {
		t.Errorf("diff of unequal lengths = %v, want nil", got)
	}
}

// TestReportsPerWindow counts Envoy 1.40's 5 s reports in a window.
func TestReportsPerWindow(t *testing.T) {
	for d, want := range map[string]string{"1m0s": "12 reports", "6s": "one report", "4s": "at most one report", "x": "at most one report"} {
		if got := reportsPerWindow(d); got != want {
			t.Errorf("reportsPerWindow(%q) = %q, want %q", d, got, want)
		}
	}
	if got := fractions([]float64{0.1, 0.5, 1}); got != "10%, 50% and 100%" {
		t.Errorf("fractions = %q", got)
	}
}

// rlqsFixture is a report of two rounds: Envoy's CPU per request for no
// filter, local_ratelimit and the quota filter, and the quota filter's
// rate points with reports a second at each rate as given (the CPU a
// second as reports × 2 ms).
func rlqsFixture(noneCPU, localCPU, quotaCPU float64, reports ...float64) *rlqsReport {
	r := &rlqsReport{Rounds: 2, Keys: 100, Rate: rlqsRate, Burst: rlqsBurst, Fractions: rlqsFractions, RateWindow: "1m0s", Denied: 100}
	add := func(id int, cpu float64) *rlqsSummary {
		c := rlqsConfigs[0]
		for _, x := range rlqsConfigs {
			if x.ID == id {
				c = x
			}
		}
		s := &rlqsSummary{rlsConfig: c, Metrics: map[string]float64{"limitd_rlqs_assignments_total": 2000},
			EnvoyCPU: spreadOf([]float64{cpu, cpu}), Throughput: spreadOf([]float64{1e6 / cpu, 1e6 / cpu})}
		for range 2 {
			s.Sat = append(s.Sat, satResult{Requests: 1000, Throughput: 1e6 / cpu, CPUPerReqUS: cpu})
		}
		r.Results = append(r.Results, s)
		return s
	}
	add(50, noneCPU)
	add(51, localCPU)
	q := add(52, quotaCPU)
	for i, n := range reports {
		rps := 1000 * float64(i+1)
		q.Points = append(q.Points, ratePoint{Fraction: rlqsFractions[i], Achieved: rps, Requests: int64(rps * 60), Seconds: 60,
			Calls: n * 60, Responses: n * 60, Assignments: 100 * n * 60, StoreCalls: 40 * n * 60, ServiceCPU: 0.002 * n * 60})
	}
	return r
}

// TestRLQSSectionVerdicts: the targets' rows say met or not met from the
// per-round CPU ratio and the spans across the rate points.
func TestRLQSSectionVerdicts(t *testing.T) {
	page := func(r *rlqsReport) string {
		var b strings.Builder
		r.section(func(format string, args ...any) {
			b.WriteString(strings.TrimSpace(fmt.Sprintf(format, args...)) + "\n")
		})
		return b.String()
	}
	good := page(rlqsFixture(40, 50, 52, 0.2, 0.2, 0.25))
	for _, want := range []string{
		"| quota filter ÷ `local_ratelimit`, Envoy CPU per request (one pinned worker) | 1.04 | ≤ 1.10 | met |",
		"| quota filter: limitd's reports received a second, max ÷ min across the rates (requests ×3.0) | 1.25 | ≤ 1.50 | met |",
		"| quota filter: limitd's CPU a second, max ÷ min across the rates (requests ×3.0) | 1.25 | ≤ 1.50 | met |",
		"| Envoy's rate_limit_quota → limitd (RLQS) | 19231 | 52.0 | 1.30 | 1.04 |",
		"| Envoy's rate_limit_quota → limitd (RLQS) | 10% | 1000 | 0.20 | 0.200 | 0.20 / 20.0 | 8.0 | 0.4 |",
		"so 12 reports a window",
		"it denied 100 requests",
		"limitd sent 2000 assignments",
	} {
		if !strings.Contains(good, want) {
			t.Errorf("page lacks %q:\n%s", want, good)
		}
	}
	bad := page(rlqsFixture(40, 50, 60, 0.2, 1, 2))
	for _, want := range []string{
		"Envoy CPU per request (one pinned worker) | 1.20 | ≤ 1.10 | **not met** |",
		"reports received a second, max ÷ min across the rates (requests ×3.0) | 10.00 | ≤ 1.50 | **not met** |",
		"assignments sent a second, max ÷ min across the rates (requests ×3.0) | 10.00 | ≤ 1.50 | **not met** |",
	} {
		if !strings.Contains(bad, want) {
			t.Errorf("page lacks %q:\n%s", want, bad)
		}
	}
	none := page(rlqsFixture(40, 50, 52))
	if !strings.Contains(none, "reports received a second, max ÷ min across the rates (requests ×–) | – | ≤ 1.50 | not measured |") {
		t.Errorf("a quota filter without rate points is not marked not measured:\n%s", none)
	}
}

// TestRLQSOnlyPage: a report holding only the RLQS section renders that
// section, without the rounds' tables.
func TestRLQSOnlyPage(t *testing.T) {
	md := (&report{RLQS: rlqsFixture(40, 50, 52, 0.2, 0.2, 0.2)}).markdown()
	if !strings.Contains(md, "## Envoy's rate limit quota filter: limitd's RLQS") || strings.Contains(md, "## Envoy CPU, throughput and latency") {
		t.Errorf("page:\n%s", md)
	}
}

// TestRLQSSummariseChecks: a run is refused when a request was refused in
// a window, when the quota filter denied nothing before its first
// assignments or got none, or when a lease rule decided nothing.
func TestRLQSSummariseChecks(t *testing.T) {
	target := func(id int) *rlsTarget {
		for _, c := range rlqsConfigs {
			if c.ID == id {
				return &rlsTarget{c: c, sat: []satResult{{Requests: 1000, CPUPerReqUS: 50}}, stats: map[string]uint64{}}
			}
		}
		t.Fatalf("no configuration %d", id)
		return nil
	}
	quota := func(denied int, assignments float64, refused float64) *rlsTarget {
		q := target(52)
		q.svcPID, q.denied = 1, denied
		q.metrics = map[string]float64{"limitd_rlqs_assignments_total": assignments, "limitd_rlqs_reports_total": 3, "go_goroutines": 9}
		q.points = []ratePoint{{Fraction: 0.1, Requests: 100, Seconds: 60, Calls: 12, Assignments: 1200, Rejected: refused}}
		return q
	}
	local := target(51)
	local.stats[nativeStatPrefix+".http_local_rate_limit.ok"] = 1000
	lease := target(54)
	lease.stats["dynamicmodulescustom.tokenbucket.rule.fleet.allowed"] = 1000
	var r rlqsReport
	if err := r.summarise([]*rlsTarget{target(50), local, quota(100, 2000, 0), lease}); err != nil {
		t.Fatalf("a valid run: %v", err)
	}
	if s := r.result(52); s == nil || len(s.Metrics) != 2 || s.Metrics["limitd_rlqs_assignments_total"] != 2000 {
		t.Errorf("the quota filter's summary keeps limitd's RLQS series only: %+v", s)
	}
	for name, c := range map[string]struct {
		targets []*rlsTarget
		want    string
	}{
		"denied nothing":    {[]*rlsTarget{quota(0, 2000, 0)}, "denied nothing before its first assignments"},
		"no assignment":     {[]*rlsTarget{quota(100, 0, 0)}, "limitd sent no assignment"},
		"refused":           {[]*rlsTarget{quota(100, 2000, 0.01)}, "requests refused"},
		"local undecided":   {[]*rlsTarget{target(51)}, "local_ratelimit decided nothing"},
		"lease undecided":   {[]*rlsTarget{target(53)}, "the cluster rule decided nothing"},
		"module undecided":  {[]*rlsTarget{target(54)}, "the cluster rule decided nothing"},
		"window unreported": {[]*rlsTarget{func() *rlsTarget { q := quota(100, 2000, 0); q.points[0].Calls = 0; return q }()}, "no report or no assignment"},
	} {
		var r rlqsReport
		err := r.summarise(c.targets)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
}
