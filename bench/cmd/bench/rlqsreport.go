// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Issue 32's targets for Envoy's quota filter against limitd: Envoy's CPU
// per request at most targetQuotaVsLocal times local_ratelimit's, and
// limitd's stream work per Envoy independent of the request rate: its
// messages and CPU a second, across the rate points, within a factor of
// targetFlat of each other (the request rate grows tenfold).
const (
	targetQuotaVsLocal = 1.1
	targetFlat         = 1.5
)

// rlqsReport is the RLQS section's results (results.json "rlqs").
type rlqsReport struct {
	Date       string    `json:"date"`
	Duration   string    `json:"duration"`
	LoadStart  string    `json:"loadavg_at_start"`
	LoadEnd    string    `json:"loadavg_at_end"`
	Pinning    string    `json:"pinning"`
	Limitd     string    `json:"limitd"`
	Redis      string    `json:"redis"`
	Rounds     int       `json:"rounds"`
	Keys       int       `json:"keys"`
	Conns      int       `json:"conns"`
	OpenConns  int       `json:"open_conns"`
	Warmup     string    `json:"warmup"`
	SatWindow  string    `json:"sat_window"`
	RateWindow string    `json:"rate_window"`
	Fractions  []float64 `json:"rate_fractions"`
	Smoke      bool      `json:"smoke"`
	// Rate and Burst are the quota filter's limit per key (--rls-config).
	Rate  int64 `json:"limit_rate_per_second"`
	Burst int64 `json:"limit_burst"`
	// Denied are the requests the quota filter refused before its first
	// assignments (rlqsAwait).
	Denied  int            `json:"denied_before_first_assignments"`
	Gaps    []string       `json:"gaps"`
	Results []*rlqsSummary `json:"results"`
}

// rlqsSummary is one configuration's figures: across rounds at
// saturation (CPU in µs per request), and at each rate point.
type rlqsSummary struct {
	rlsConfig
	Throughput spread             `json:"throughput_rps"`
	EnvoyCPU   spread             `json:"envoy_cpu_us_per_req"`
	ServiceCPU spread             `json:"service_cpu_us_per_req"`
	RedisCPU   spread             `json:"redis_cpu_us_per_req"`
	Points     []ratePoint        `json:"rate_points,omitempty"`
	Stats      map[string]uint64  `json:"envoy_stats"`
	Metrics    map[string]float64 `json:"limitd_metrics,omitempty"`
	Note       string             `json:"note,omitempty"`
	Sat        []satResult        `json:"saturation_runs"`
}

// rlqsStats are the Envoy statistics kept.
var rlqsStats = []string{"http.ingress.downstream_rq_total", "http.ingress.downstream_rq_2xx", "http.ingress.downstream_rq_4xx",
	"http.ingress.downstream_rq_5xx", nativeStatPrefix + ".http_local_rate_limit.ok", nativeStatPrefix + ".http_local_rate_limit.rate_limited",
	"wasmcustom.tokenbucket.rule.fleet.allowed", "wasmcustom.tokenbucket.rule.fleet.rejected", "wasmcustom.tokenbucket.service_errors",
	leaseCallsStat, "dynamicmodulescustom.tokenbucket.rule.fleet.allowed", "dynamicmodulescustom.tokenbucket.rule.fleet.rejected",
	"dynamicmodulescustom.tokenbucket.service_errors", moduleLease}

// summarise fills r.Results from the targets and checks that nothing was
// refused in a measured window, that the quota filter enforced limitd's
// assignments (it denied requests before the first ones, and assignments
// kept coming) and that each limiter decided.
func (r *rlqsReport) summarise(targets []*rlsTarget) error {
	var problems []string
	for _, t := range targets {
		s := &rlqsSummary{rlsConfig: t.c, Stats: keepStats(t.stats, rlqsStats), Sat: t.sat, Points: t.points}
		if t.metrics != nil {
			s.Metrics = map[string]float64{}
			for k, v := range t.metrics {
				if strings.HasPrefix(k, "limitd_rlqs_") {
					s.Metrics[k] = v
				}
			}
		}
		col := func(f func(x satResult) float64) spread {
			xs := make([]float64, len(t.sat))
			for i, x := range t.sat {
				xs[i] = math.NaN()
				if x.Requests > 0 {
					xs[i] = f(x)
				}
			}
			return spreadOf(xs)
		}
		s.Throughput = col(func(x satResult) float64 { return x.Throughput })
		s.EnvoyCPU = col(func(x satResult) float64 { return x.CPUPerReqUS })
		if t.svcPID != 0 {
			s.ServiceCPU = col(func(x satResult) float64 { return perReq(x, 0) })
			s.RedisCPU = col(func(x satResult) float64 { return perReq(x, 1) })
		}
		var errs int64
		refused := false
		for _, x := range t.sat {
			errs += x.Errors
			refused = refused || x.Rejected > 0
		}
		for _, p := range t.points {
			errs += p.Errors
			refused = refused || p.Rejected > 0
		}
		if refused {
			problems = append(problems, fmt.Sprintf("(%d): requests refused under a load no limit reaches", t.c.ID))
		}
		var notes []string
		if errs > 0 {
			notes = append(notes, fmt.Sprintf(noteFailed, errs))
		}
		switch t.c.Kind {
		case rlsLocal:
			if s.Stats[nativeStatPrefix+".http_local_rate_limit.ok"] == 0 {
				problems = append(problems, fmt.Sprintf("(%d): local_ratelimit decided nothing", t.c.ID))
			}
		case rlsQuota:
			if t.denied == 0 {
				problems = append(problems, fmt.Sprintf("(%d): the quota filter denied nothing before its first assignments: it does not enforce limitd's", t.c.ID))
			}
			if s.Metrics["limitd_rlqs_assignments_total"] == 0 {
				problems = append(problems, fmt.Sprintf("(%d): limitd sent no assignment", t.c.ID))
			}
			for _, p := range t.points { // (55) has none
				if p.Calls == 0 || p.Assignments == 0 {
					problems = append(problems, fmt.Sprintf("(%d): no report or no assignment in the window at %.0f%%", t.c.ID, 100*p.Fraction))
				}
			}
		case rlsLease, rlsModuleLease:
			prefix := "wasmcustom."
			if t.c.Kind == rlsModuleLease {
				prefix = "dynamicmodulescustom."
			}
			if s.Stats[prefix+"tokenbucket.rule.fleet.allowed"] == 0 {
				problems = append(problems, fmt.Sprintf("(%d): the cluster rule decided nothing", t.c.ID))
			}
			if n := s.Stats[prefix+"tokenbucket.service_errors"]; n > 0 {
				notes = append(notes, fmt.Sprintf(noteFailedOpen, n))
			}
		}
		s.Note = strings.Join(notes, "; ")
		r.Results = append(r.Results, s)
	}
	if len(problems) > 0 {
		return fmt.Errorf("bench: the RLQS section's results are not valid:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

func (r *rlqsReport) result(id int) *rlqsSummary { return byID(r.Results, id) }

// cpuRatio is a's Envoy CPU per request ÷ b's, round by round (rounds where
// either got no answer left out), summarised.
func (r *rlqsReport) cpuRatio(a, b int) spread {
	sa, sb := r.result(a), r.result(b)
	if sa == nil || sb == nil {
		return spread{}
	}
	var xs []float64
	for i := range min(len(sa.Sat), len(sb.Sat)) {
		if sa.Sat[i].Requests > 0 && sb.Sat[i].Requests > 0 {
			xs = append(xs, sa.Sat[i].CPUPerReqUS/sb.Sat[i].CPUPerReqUS)
		}
	}
	return spreadOf(xs)
}

// spanOf is the largest ÷ the smallest of v over s's rate points (one
// figure, N 1; none when a point is 0 or there are fewer than two).
func spanOf(s *rlqsSummary, v func(p ratePoint) float64) spread {
	if s == nil || len(s.Points) < 2 {
		return spread{}
	}
	var xs []float64
	for _, p := range s.Points {
		xs = append(xs, v(p))
	}
	lo, hi := slices.Min(xs), slices.Max(xs)
	if lo <= 0 {
		return spread{}
	}
	return spreadOf([]float64{hi / lo})
}

// rlqsSummary is the RLQS section's short text.
func (r *report) rlqsSummary() string {
	if r.RLQS == nil {
		return ""
	}
	var b strings.Builder
	for _, s := range r.RLQS.Results {
		fmt.Fprintf(&b, "%-64s %8.0f req/s  Envoy CPU %5.1f µs/req\n", s.Label, s.Throughput.Median, s.EnvoyCPU.Median)
		for _, p := range s.Points {
			fmt.Fprintf(&b, "  at %3.0f%%: %7.0f req/s, limitd calls %6.2f/s = %7.3f per 1000 req, limitd CPU %6.1f ms/s\n",
				100*p.Fraction, p.Achieved, p.PerSecond(p.Calls), p.Per1000(p.Calls), 1000*p.PerSecond(p.ServiceCPU))
		}
	}
	for _, g := range r.RLQS.Gaps {
		b.WriteString("gap: " + g + "\n")
	}
	return b.String()
}

// section writes the RLQS section of the page.
func (r *rlqsReport) section(w func(string, ...any)) {
	w("\n## Envoy's rate limit quota filter: limitd's RLQS\n\n")
	measuredBy(w, "bench-rlqs", r.Date, r.Duration, r.Smoke, r.LoadStart, r.LoadEnd)
	w("Stock Envoy's `envoy.filters.http.rate_limit_quota` filter puts each request in the bucket `{api_key: <x-api-key>}` (%d values), reports usage to limitd's RLQS on one gRPC stream and enforces the token buckets limitd assigns (`DENY_ALL` before the first). limitd's limit, %d a second, burst %d, per key, is never reached. Beside it: no filter, `local_ratelimit` (a bucket per key), and the plugin's and the native module's leases (one hot key); each limitd has its own Redis.\n\n",
		r.Keys, r.Rate, r.Burst)
	w("| configuration | saturated req/s | Envoy CPU µs/req | ÷ no filter | ÷ `local_ratelimit` |\n|---|---|---|---|---|\n")
	for _, s := range r.Results {
		w("| %s | %s | %s | %s | %s |\n", s.Label, fm(s.Throughput, 0), f(s.EnvoyCPU, 1), f(r.cpuRatio(s.ID, 50), 2), f(r.cpuRatio(s.ID, 51), 2))
	}
	w("\n**limitd's work against the request rate**: windows of %s at %s of each configuration's saturated throughput (an open loop on %d connections; at 100%% the closed loop). *Calls*: the quota filter's usage reports (`limitd_rlqs_reports_total`; Envoy 1.40 reports every 5 s whatever `reporting_interval` says, so %s a window, give or take one), or the lease calls; beside them limitd's responses, assignments and Redis calls.\n\n",
		r.RateWindow, fractions(r.Fractions), r.OpenConns, reportsPerWindow(r.RateWindow))
	w("| configuration | load | req/s | calls/s | calls per 1,000 req | responses / assignments per s | Redis calls per s | limitd CPU ms/s | its Redis ms/s | limitd CPU µs/req |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Results {
		for i, p := range s.Points {
			name := s.Label
			if i > 0 {
				name = ""
			}
			sent, store := "–", "–"
			if s.Kind == rlsQuota {
				sent = fmt.Sprintf("%.2f / %.1f", p.PerSecond(p.Responses), p.PerSecond(p.Assignments))
				store = fmt.Sprintf("%.1f", p.PerSecond(p.StoreCalls))
			}
			w("| %s | %.0f%% | %.0f | %.2f | %.3f | %s | %s | %.1f | %.1f | %.2f |\n", name, 100*p.Fraction, p.Achieved,
				p.PerSecond(p.Calls), p.Per1000(p.Calls), sent, store, 1000*p.PerSecond(p.ServiceCPU), 1000*p.PerSecond(p.RedisCPU), 1000*p.Per1000(p.ServiceCPU))
		}
	}
	for _, s := range r.Results {
		if s.Note != "" {
			w("\n*%s:* %s.\n", s.Label, s.Note)
		}
	}
	for _, g := range r.Gaps {
		w("\n**Gap:** %s\n", g)
	}
	w("\nAgainst the issue's targets:\n\n")
	w("| figure | measured | target | |\n|---|---|---|---|\n")
	ratio := r.cpuRatio(52, 51)
	w("| quota filter ÷ `local_ratelimit`, Envoy CPU per request (one pinned worker) | %s | ≤ %.2f | %s |\n", f(ratio, 2), targetQuotaVsLocal, verdict(ratio, targetQuotaVsLocal))
	if floor := r.cpuRatio(rlqsFloorID, 51); floor.N > 0 {
		w("| of which the quota filter's own cost: the filter with every bucket `ALLOW_ALL` ÷ `local_ratelimit` | %s | | Envoy's, not limitd's |\n", f(floor, 2))
		w("| of which limitd's token buckets: the filter with limitd's assignments ÷ the filter with every bucket `ALLOW_ALL` | %s | | |\n", f(r.cpuRatio(52, rlqsFloorID), 2))
	}
	q := r.result(52)
	reqs := spanOf(q, func(p ratePoint) float64 { return p.Achieved })
	for _, row := range []struct {
		name string
		v    func(p ratePoint) float64
	}{
		{"reports received a second", func(p ratePoint) float64 { return p.PerSecond(p.Calls) }},
		{"assignments sent a second", func(p ratePoint) float64 { return p.PerSecond(p.Assignments) }},
		{"CPU a second", func(p ratePoint) float64 { return p.PerSecond(p.ServiceCPU) }},
	} {
		v := spanOf(q, row.v)
		w("| quota filter: limitd's %s, max ÷ min across the rates (requests ×%s) | %s | ≤ %.2f | %s |\n",
			row.name, fm(reqs, 1), f(v, 2), targetFlat, verdict(v, targetFlat))
	}
	if q != nil {
		w("\nThe quota filter enforced limitd's assignments: before the windows it denied %d requests (`DENY_ALL`), then admitted every key; limitd sent %.0f assignments, and no window refused a request.\n",
			r.Denied, q.Metrics["limitd_rlqs_assignments_total"])
	}
	w("\nlimitd %s; %s. As in [the method](#method), each limitd and its Redis on the generator's CPU; %d saturated rounds (%d connections, %s), then the rate points.\n",
		r.Limitd, redisVersion(r.Redis), r.Rounds, r.Conns, r.SatWindow)
}

// callers name what calls limitd in each configuration with rate points.
var callers = map[rlsKind]string{rlsQuota: "quota filter", rlsLease: "plugin's leases", rlsModuleLease: "native module's leases"}

// fractions names the rate points: "10%, 50% and 100%".
func fractions(fs []float64) string {
	var xs []string
	for _, x := range fs {
		xs = append(xs, fmt.Sprintf("%.0f%%", 100*x))
	}
	if len(xs) < 2 {
		return strings.Join(xs, "")
	}
	return strings.Join(xs[:len(xs)-1], ", ") + " and " + xs[len(xs)-1]
}

// reportsPerWindow is how many of Envoy 1.40's 5 s reports a window of d
// (a time.Duration's text) holds.
func reportsPerWindow(d string) string {
	w, err := time.ParseDuration(d)
	switch n := int(w / (5 * time.Second)); {
	case err != nil || n < 1:
		return "at most one report"
	case n == 1:
		return "one report"
	default:
		return fmt.Sprintf("%d reports", n)
	}
}

// redisVersionRE is the version in redis-server --version's line.
var redisVersionRE = regexp.MustCompile(`\bv=(\S+)`)

// redisVersion is "Redis <version>" from redis-server --version's line, or
// the line when it has none.
func redisVersion(line string) string {
	if m := redisVersionRE.FindStringSubmatch(line); m != nil {
		return "Redis " + m[1]
	}
	return line
}
