// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Issue 31's targets for limitd behind Envoy's ratelimit filter, against
// envoyproxy/ratelimit under the same load: CPU per decision (the service's
// and its Redis's) at most this ratio, and a p99 no worse.
const targetRLSCPU = 0.5

// rlsReport is the RLS section's results (results.json "rls").
type rlsReport struct {
	Date      string        `json:"date"`
	Duration  string        `json:"duration"`
	LoadStart string        `json:"loadavg_at_start"`
	LoadEnd   string        `json:"loadavg_at_end"`
	Pinning   string        `json:"pinning"`
	Ratelimit string        `json:"envoyproxy_ratelimit"`
	Limitd    string        `json:"limitd"`
	Redis     string        `json:"redis"`
	Rounds    int           `json:"rounds"`
	Keys      int           `json:"keys"`
	Conns     int           `json:"conns"`
	OpenConns int           `json:"open_conns"`
	Load      float64       `json:"load_fraction_of_slowest"`
	Rate      float64       `json:"fixed_rate_rps"`
	Warmup    string        `json:"warmup"`
	SatWindow string        `json:"sat_window"`
	LatWindow string        `json:"lat_window"`
	Smoke     bool          `json:"smoke"`
	EdgeLimit int           `json:"edge_limit_per_second"`
	Gaps      []string      `json:"gaps"`
	Results   []*rlsSummary `json:"results"`
	Profiles  []rlsProfile  `json:"profiles,omitempty"`
}

// profileEntry is one function's share of limitd's CPU samples.
type profileEntry struct {
	Function string  `json:"function"`
	Share    float64 `json:"share"`
}

// rlsSummary is one configuration's figures across rounds; the CPU figures
// are microseconds per request (one decision each) at saturation.
type rlsSummary struct {
	rlsConfig
	Throughput spread `json:"throughput_rps"`
	EnvoyCPU   spread `json:"envoy_cpu_us_per_req"`
	ServiceCPU spread `json:"service_cpu_us_per_req"`
	RedisCPU   spread `json:"redis_cpu_us_per_req"`
	Decision   spread `json:"service_and_redis_cpu_us_per_req"`
	P50        spread `json:"p50_us"`
	P99        spread `json:"p99_us"`
	AddP50     spread `json:"added_p50_us_vs_no_filter"`
	AddP99     spread `json:"added_p99_us_vs_no_filter"`
	Achieved   spread `json:"achieved_rps_fixed_rate"`
	// The CPU figures at the fixed rate, per answer in its window.
	FixService  spread            `json:"service_cpu_us_per_req_fixed_rate"`
	FixRedis    spread            `json:"redis_cpu_us_per_req_fixed_rate"`
	FixDecision spread            `json:"service_and_redis_cpu_us_per_req_fixed_rate"`
	Stats       map[string]uint64 `json:"envoy_stats"`
	Edges       []edgeTrial       `json:"edge_trials,omitempty"`
	Note        string            `json:"note,omitempty"`
	Sat         []satResult       `json:"saturation_runs"`
	Lat         []latResult       `json:"fixed_rate_runs"`
}

// rlsStats are the Envoy statistics kept: requests, 5xx, and the ratelimit
// filter's counters (under the route's cluster, "upstream").
var rlsStats = []string{"http.ingress.downstream_rq_total", "http.ingress.downstream_rq_5xx",
	"cluster.upstream.ratelimit.ok", "cluster.upstream.ratelimit.over_limit", "cluster.upstream.ratelimit.error",
	"cluster.upstream.ratelimit.failure_mode_allowed", "wasmcustom.tokenbucket.rule.fleet.allowed",
	"wasmcustom.tokenbucket.rule.fleet.rejected", "wasmcustom.tokenbucket.service_errors", leaseCallsStat}

// summarise fills r.Results from the targets and checks that the load was
// decided and never refused.
func (r *rlsReport) summarise(targets []*rlsTarget) error {
	var none *rlsTarget
	for _, t := range targets {
		if t.c.Kind == rlsNone {
			none = t
		}
	}
	var problems []string
	for _, t := range targets {
		s := &rlsSummary{rlsConfig: t.c, Stats: keepStats(t.stats, rlsStats), Edges: t.edges, Sat: t.sat, Lat: t.lat}
		col := func(f func(i int) float64) spread {
			xs := make([]float64, len(t.sat))
			for i := range xs {
				xs[i] = f(i)
				if math.IsInf(xs[i], 0) {
					xs[i] = math.NaN()
				}
			}
			return spreadOf(xs)
		}
		sat := func(i int, v float64) float64 {
			if t.sat[i].Requests == 0 {
				return math.NaN()
			}
			return v
		}
		lat := func(x *rlsTarget, i int, v float64) float64 {
			if x.lat[i].Samples == 0 {
				return math.NaN()
			}
			return v
		}
		s.Throughput = col(func(i int) float64 { return sat(i, t.sat[i].Throughput) })
		s.EnvoyCPU = col(func(i int) float64 { return sat(i, t.sat[i].CPUPerReqUS) })
		if t.c.Kind != rlsNone {
			s.ServiceCPU = col(func(i int) float64 { return sat(i, perReq(t.sat[i], 0)) })
			s.RedisCPU = col(func(i int) float64 { return sat(i, perReq(t.sat[i], 1)) })
			s.Decision = col(func(i int) float64 { return sat(i, perReq(t.sat[i], 0)+perReq(t.sat[i], 1)) })
			s.FixService = col(func(i int) float64 { return lat(t, i, perAnswer(t.lat[i], 0)) })
			s.FixRedis = col(func(i int) float64 { return lat(t, i, perAnswer(t.lat[i], 1)) })
			s.FixDecision = col(func(i int) float64 { return lat(t, i, perAnswer(t.lat[i], 0)+perAnswer(t.lat[i], 1)) })
		}
		s.P50 = col(func(i int) float64 { return lat(t, i, t.lat[i].P50US) })
		s.P99 = col(func(i int) float64 { return lat(t, i, t.lat[i].P99US) })
		s.Achieved = col(func(i int) float64 { return t.lat[i].Achieved })
		if none != nil && t != none {
			s.AddP50 = col(func(i int) float64 { return lat(t, i, lat(none, i, t.lat[i].P50US-none.lat[i].P50US)) })
			s.AddP99 = col(func(i int) float64 { return lat(t, i, lat(none, i, t.lat[i].P99US-none.lat[i].P99US)) })
		}
		var errs int64
		for i := range t.sat {
			errs += t.sat[i].Errors + t.lat[i].Errors
			if t.sat[i].Rejected > 0 || t.lat[i].Rejected > 0 {
				problems = append(problems, fmt.Sprintf("(%d): requests refused under a load no limit reaches", t.c.ID))
			}
		}
		var notes []string
		if errs > 0 {
			notes = append(notes, fmt.Sprintf(noteFailed, errs))
		}
		switch t.c.Kind {
		case rlsRatelimit, rlsLimitd:
			if s.Stats["cluster.upstream.ratelimit.ok"] == 0 {
				problems = append(problems, fmt.Sprintf("(%d): cluster.upstream.ratelimit.ok is 0: the service decided nothing", t.c.ID))
			}
			if n := s.Stats["cluster.upstream.ratelimit.error"]; n > 0 {
				notes = append(notes, fmt.Sprintf("%d calls to the service failed (Envoy's cluster.upstream.ratelimit.error: an error or the filter's 1 s timeout), answered 500 by failure_mode_deny", n))
			}
		case rlsPlugin, rlsLease:
			if s.Stats["wasmcustom.tokenbucket.rule.fleet.allowed"] == 0 {
				problems = append(problems, fmt.Sprintf("(%d): the plugin's cluster rule decided nothing", t.c.ID))
			}
			// The plugin fails open (its failure_mode): the request was
			// answered, and the page says how often (as the rounds' do).
			if n := s.Stats["wasmcustom.tokenbucket.service_errors"]; n > 0 {
				notes = append(notes, fmt.Sprintf(noteFailedOpen, n))
			}
		}
		s.Note = strings.Join(notes, "; ")
		r.Results = append(r.Results, s)
	}
	if len(problems) > 0 {
		return fmt.Errorf("bench: the RLS section's results are not valid:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

func (r *rlsReport) result(id int) *rlsSummary { return byID(r.Results, id) }

// byID is the summary of configuration id in ss (the zero S when none).
func byID[S interface{ configID() int }](ss []S, id int) S {
	for _, s := range ss {
		if s.configID() == id {
			return s
		}
	}
	var none S
	return none
}

// keepStats is the statistics of stats named in keys.
func keepStats(stats map[string]uint64, keys []string) map[string]uint64 {
	out := map[string]uint64{}
	for _, k := range keys {
		if v, ok := stats[k]; ok {
			out[k] = v
		}
	}
	return out
}

// The notes a configuration of the RLS or RLQS section may get: failures
// are kept and shown, not a void run (on a loaded machine a call can
// outlive its 1 s timeout, and how often is a finding).
const (
	noteFailed     = "%d requests failed in the measured windows (transport errors or statuses other than 200 and 429)"
	noteFailedOpen = "%d limit-service calls failed open (an error or the rule's 1 s timeout)"
)

// measuredBy writes the first sentence of a section measured by make
// target (alone) or make bench: when, how long, and the load average.
func measuredBy(w func(string, ...any), target, date, duration string, smoke bool, loadStart, loadEnd string) {
	w("Measured by `make %s` (this section alone) or `make bench` on %s in %s", target, date, duration)
	if smoke {
		w(" (**smoke run**: one short round, figures are indicative only)")
	}
	w("; load average %s at the start, %s at the end. ", loadStart, loadEnd)
}

// perRound is f of figure v of the configurations ids, round by round
// (rounds where one of them got no answer left out), summarised.
func (r *rlsReport) perRound(v func(s *rlsSummary, i int) float64, f func([]float64) float64, ids ...int) spread {
	var ss []*rlsSummary
	for _, id := range ids {
		s := r.result(id)
		if s == nil {
			return spread{}
		}
		ss = append(ss, s)
	}
	var xs []float64
	for i := range ss[0].Sat {
		vals := make([]float64, len(ss))
		ok := true
		for j, s := range ss {
			if i >= len(s.Sat) || s.Sat[i].Requests == 0 || i >= len(s.Lat) || s.Lat[i].Samples == 0 {
				ok = false
				break
			}
			vals[j] = v(s, i)
		}
		if ok {
			xs = append(xs, f(vals))
		}
	}
	return spreadOf(xs)
}

// decisionCPU is round i's service + Redis CPU µs per request.
func decisionCPU(s *rlsSummary, i int) float64 { return perReq(s.Sat[i], 0) + perReq(s.Sat[i], 1) }

// fixedCPU is round i's service + Redis CPU per decision at the fixed rate.
func fixedCPU(s *rlsSummary, i int) float64 { return perAnswer(s.Lat[i], 0) + perAnswer(s.Lat[i], 1) }

// perAnswer is watched process i's CPU microseconds per answer of the
// fixed-rate run l.
func perAnswer(l latResult, i int) float64 {
	if i >= len(l.Watched) || l.Samples == 0 {
		return 0
	}
	return l.Watched[i] / float64(l.Samples) * 1e6
}

// preempted is round i's preemptions of the service per decision,
// saturated (NaN, left out, for a run that did not read them).
func preempted(s *rlsSummary, i int) float64 {
	if len(s.Sat[i].Preempted) == 0 {
		return math.NaN()
	}
	return s.Sat[i].Preempted[0] / float64(s.Sat[i].Requests)
}

// p99 is round i's p99 at the fixed rate.
func p99(s *rlsSummary, i int) float64 { return s.Lat[i].P99US }

func difference(c []float64) float64 { return c[0] - c[1] }

func first(c []float64) float64 { return c[0] }

// section writes the RLS section of the page.
func (r *rlsReport) section(w func(string, ...any)) {
	w("\n## Envoy's ratelimit filter: envoyproxy/ratelimit or limitd\n\n")
	measuredBy(w, "bench-rls", r.Date, r.Duration, r.Smoke, r.LoadStart, r.LoadEnd)
	w("Envoy's `envoy.filters.http.ratelimit` filter asks envoyproxy/ratelimit (*the peer*) or limitd over gRPC, one descriptor per request (`api_key`, %d values, a limit no load reaches), each service with its own `redis-server` and the same YAML; beside them the plugin's cluster rule through limitd's HTTP API. *Service + Redis*: their CPU per request answered (one decision), saturated or at %.0f req/s; the targets' ratios are within each round.\n\n",
		r.Keys, r.Rate)
	w("| configuration | saturated req/s | Envoy CPU µs/req | service µs/req | Redis µs/req | service + Redis µs/req | at the fixed rate: service + Redis µs/req | p99 µs | p99 − no filter µs |\n")
	w("|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Results {
		dec, fixed := "–", "–"
		if s.Kind != rlsNone {
			dec, fixed = f(r.perRound(decisionCPU, first, s.ID), 1), f(r.perRound(fixedCPU, first, s.ID), 1)
		}
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Label, fm(s.Throughput, 0), fm(s.EnvoyCPU, 1),
			fm(s.ServiceCPU, 1), fm(s.RedisCPU, 1), dec, fixed, fm(r.perRound(p99, first, s.ID), 0), fsm(s.AddP99, 0))
	}
	var pre []string
	for _, c := range []struct {
		id   int
		name string
	}{{41, "the peer"}, {43, "token buckets"}, {rlsFloorConfig.ID, "a script's floor"}, {rlsMemoryID, "in memory"}} {
		if v := r.perRound(preempted, first, c.id); v.N > 0 {
			pre = append(pre, fmt.Sprintf("%s %s", c.name, f(v, 2)))
		}
	}
	if len(pre) > 0 {
		w("\n*Preempted* per decision, saturated (the service's `nonvoluntary_ctxt_switches`): %s.\n", strings.Join(pre, ", "))
	}
	if r.result(rlsFloorConfig.ID) != nil {
		w("\n*A script's floor*: limitd's `-tags benchfloor` build, never deployed: each decision is one script call (`service/take_floor.lua`) that reads the record and clock, writes it and admits.\n")
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
	rw := func(name string, v spread, prec int, target string, verdict string) {
		w("| %s | %s | %s | %s |\n", name, f(v, prec), target, verdict)
	}
	for _, id := range []int{43, 42} {
		lim := r.result(id)
		if lim == nil {
			continue
		}
		sat := r.perRound(decisionCPU, ratio, id, 41)
		rw(fmt.Sprintf("%s ÷ peer, saturated", lim.Label), sat, 2,
			fmt.Sprintf("≤ %.2f", targetRLSCPU), verdict(sat, targetRLSCPU))
		fix := r.perRound(fixedCPU, ratio, id, 41)
		rw(fmt.Sprintf("%s ÷ peer, fixed rate", lim.Label), fix, 2,
			fmt.Sprintf("≤ %.2f", targetRLSCPU), verdict(fix, targetRLSCPU))
		d := r.perRound(p99, difference, id, 41)
		rw(fmt.Sprintf("%s − peer, p99 µs", lim.Label), d, 0, "≤ 0", verdict(d, 0))
	}
	// Not targets: floors under limitd's token buckets. The door's has no
	// store to cut (the memory store's work is a few map reads); a script's
	// makes one script call per decision that reads and writes the record,
	// with none of the arithmetic (the benchfloor build).
	for _, fl := range []struct {
		id                 int
		name, below, above string
	}{
		{rlsMemoryID, "the door's floor: limitd in memory", "the store's cost", "any store under this door"},
		{rlsFloorConfig.ID, "a script's floor: read, clock, write", "the script's arithmetic", "one script call per decision"},
	} {
		if r.result(fl.id) == nil || r.result(41) == nil {
			continue
		}
		sat, fix := r.perRound(decisionCPU, ratio, fl.id, 41), r.perRound(fixedCPU, ratio, fl.id, 41)
		rw(fl.name+" ÷ peer, saturated", sat, 2, fmt.Sprintf("≤ %.2f", targetRLSCPU), floorVerdict(sat, fl.below, fl.above))
		rw(fl.name+" ÷ peer, fixed rate", fix, 2, fmt.Sprintf("≤ %.2f", targetRLSCPU), floorVerdict(fix, fl.below, fl.above))
	}
	if lim := r.result(43); lim != nil && len(lim.Edges) > 0 {
		most, bound, clean := 0, 0, 0
		for _, e := range lim.Edges {
			if e.Clean {
				clean++
				if e.Admitted()-e.Bound() > most-bound || clean == 1 {
					most, bound = e.Admitted(), e.Bound()
				}
			}
		}
		switch {
		case clean == 0:
			w("| %s: admitted across a window edge | no trial on time | ≤ the bound | not measured |\n", lim.Label)
		default:
			v := "met"
			if most > bound {
				v = "**not met**"
			}
			w("| %s: admitted across a window edge, the trial nearest its bound | %d (bound %d) | ≤ the bound | %s |\n", lim.Label, most, bound, v)
		}
	}
	if fw, up := r.result(42), r.result(41); fw != nil && up != nil && len(fw.Edges) > 0 && len(up.Edges) > 0 {
		w("| %s: admitted across a window edge | %s | as the peer: %s | %s |\n", fw.Label,
			admittedList(fw.Edges), admittedList(up.Edges), sameVerdict(fw.Edges, up.Edges))
	}
	if r.result(41) == nil || (r.result(42) == nil && r.result(43) == nil) {
		w("| limitd against envoyproxy/ratelimit | not measured | | |\n")
	}
	r.edgeTable(w)
	if len(r.Profiles) > 0 {
		w("\nWhere the CPU goes, saturated (`perf record -e cpu-clock -p <pid>`, %v): a service's by Go package, Redis's by function, the top %d with µs per decision.\n\n| process | µs per decision (samples) | where |\n|---|---|---|\n", rlsProfileFor, rlsPageTop)
	}
	for _, p := range r.Profiles {
		var top []string
		for i, e := range p.Top {
			if i == rlsPageTop {
				break
			}
			top = append(top, fmt.Sprintf("`%s` %.1f", e.Function, e.Share*p.CPUUS))
		}
		w("| %s | %.1f (%d) | %s |\n", p.Label, p.CPUUS, p.Samples, strings.Join(top, ", "))
	}
	w("\nenvoyproxy/ratelimit %s (`make build-ratelimit`, `USE_STATSD=false`); limitd %s; %s. As in [the method](#method), each service and its Redis on the generator's CPU; %d rounds, saturated (%d connections, %s) and at the fixed rate (%d connections, %s).\n",
		r.Ratelimit, r.Limitd, redisVersion(r.Redis), r.Rounds, r.Conns, r.SatWindow, r.OpenConns, r.LatWindow)
}

// rlsPageTop is how many entries of each profile the page names (results.json keeps rlsProfileTop).
const rlsPageTop = 4

// edgeTable shows the bursts across a window edge, a row per
// configuration.
func (r *rlsReport) edgeTable(w func(string, ...any)) {
	var rows []*rlsSummary
	for _, s := range r.Results {
		if len(s.Edges) > 0 {
			rows = append(rows, s)
		}
	}
	if len(rows) == 0 {
		return
	}
	w("\n**Across a window edge**: a limit of %d a second; a trial sends %d requests on a fresh value 250 ms before a second starts and %d more 50 ms after. A fixed window admits up to twice the limit, a token bucket at most %d + %d × (first send to last answer, s), the *bound*; a trial counts when each burst was answered on its side of the edge (at most %d tries).\n\n",
		r.EdgeLimit, edgeBurst, edgeBurst, r.EdgeLimit, r.EdgeLimit, edgeAttempts)
	w("| configuration | admitted per trial, before + after | span ms | bound | tries |\n|---|---|---|---|---|\n")
	for _, s := range rows {
		var adm, span, bound, tries []string
		for _, e := range s.Edges {
			adm = append(adm, fmt.Sprintf("%d + %d", e.Before, e.After))
			span = append(span, fmt.Sprintf("%.0f", e.SpanMS))
			bound = append(bound, fmt.Sprint(e.Bound()))
			t := fmt.Sprint(e.Attempts)
			if !e.Clean {
				t += " (none on time)"
			}
			tries = append(tries, t)
		}
		w("| %s | %s | %s | %s | %s |\n", s.Label, strings.Join(adm, ", "), strings.Join(span, ", "), strings.Join(slices.Compact(bound), ", "), strings.Join(tries, ", "))
	}
}

// admittedList is the admitted counts of the trials that ran on time.
func admittedList(es []edgeTrial) string {
	var xs []string
	for _, e := range es {
		if e.Clean {
			xs = append(xs, fmt.Sprint(e.Admitted()))
		}
	}
	if len(xs) == 0 {
		return "none on time"
	}
	return strings.Join(xs, ", ")
}

// sameVerdict says whether every on-time trial of a admitted what every
// on-time trial of b did (both fixed windows admit twice the limit).
func sameVerdict(a, b []edgeTrial) string {
	var vals []int
	for _, es := range [][]edgeTrial{a, b} {
		for _, e := range es {
			if e.Clean {
				vals = append(vals, e.Admitted())
			}
		}
	}
	if len(vals) == 0 || admittedList(a) == "none on time" || admittedList(b) == "none on time" {
		return "not measured"
	}
	for _, v := range vals {
		if v != vals[0] {
			return "**differs**"
		}
	}
	return "met"
}

// floorVerdict says what a floor (v, a ratio to the peer) leaves of the
// target: below it, the target is reachable by what the floor leaves out
// (below); above it, by nothing the floor includes (above).
func floorVerdict(v spread, below, above string) string {
	switch verdict(v, targetRLSCPU) {
	case "met":
		return "below: the target is reachable by " + below
	case "**not met**":
		return "**above: out of reach of " + above + "**"
	}
	return "not measured"
}
