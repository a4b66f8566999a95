// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// spread summarises one figure across rounds.
type spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// spreadOf summarises xs, leaving out NaNs (rounds whose run produced no
// answer: the shared machine starved Envoy or the load generator).
func spreadOf(xs []float64) spread {
	s := slices.DeleteFunc(slices.Clone(xs), math.IsNaN)
	if len(s) == 0 {
		return spread{}
	}
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// summary is one configuration's figures across rounds. Ratios and
// differences are taken per round (against the same round's reference,
// which ran minutes apart at most) and then summarised.
type summary struct {
	ID          int               `json:"id"`
	Name        string            `json:"name"`
	Label       string            `json:"label"`
	Limit       limit             `json:"per_key_limit"`
	Throughput  spread            `json:"throughput_rps"`
	Rejected    spread            `json:"rejected_fraction_saturated"`
	CPUSat      spread            `json:"envoy_cpu_us_per_req_saturated"`
	Capacity    spread            `json:"capacity_rps_per_envoy_core"` // 1 / CPUSat
	CapVs1      spread            `json:"capacity_ratio_vs_1"`
	CapVs2      spread            `json:"capacity_ratio_vs_2"`
	CPULat      spread            `json:"envoy_cpu_us_per_req_fixed_rate"`
	P50         spread            `json:"p50_us"`
	P90         spread            `json:"p90_us"`
	P99         spread            `json:"p99_us"`
	Achieved    spread            `json:"achieved_rps_fixed_rate"`
	Late        spread            `json:"late_fraction_fixed_rate"`
	Dropped     spread            `json:"dropped_fraction_fixed_rate"`
	BusyLat     spread            `json:"envoy_busy_fraction_fixed_rate"`
	RejectedLat spread            `json:"rejected_fraction_fixed_rate"`
	RSSMiB      spread            `json:"envoy_rss_mib"`
	Core0Other  spread            `json:"core0_other_fraction"`
	Core1Other  spread            `json:"core1_other_fraction"`
	Core1Busy   spread            `json:"core1_busy_fraction_fixed_rate"`
	ThrVs1      spread            `json:"throughput_ratio_vs_1"`
	ThrVs2      spread            `json:"throughput_ratio_vs_2"`
	CPUVs1      spread            `json:"cpu_per_req_ratio_vs_1"`
	CPUVs2      spread            `json:"cpu_per_req_ratio_vs_2"`
	AddP50Vs1   spread            `json:"added_p50_us_vs_1"`
	AddP99Vs1   spread            `json:"added_p99_us_vs_1"`
	AddP50Vs2   spread            `json:"added_p50_us_vs_2"`
	AddP99Vs2   spread            `json:"added_p99_us_vs_2"`
	Stats       map[string]uint64 `json:"envoy_stats"`
	Note        string            `json:"note,omitempty"`
	Sat         []satResult       `json:"saturation_runs"`
	Lat         []latResult       `json:"fixed_rate_runs"`
	Half        []latResult       `json:"half_load_runs,omitempty"` // (3) and (11): at half of (3)'s saturated throughput
	HalfP50     spread            `json:"half_load_p50_us"`
	has1, has2  bool
}

type report struct {
	Info    info       `json:"info"`
	Rate    float64    `json:"fixed_rate_rps"`
	Results []*summary `json:"results"`
}

func (b *bench) report() *report {
	rep := &report{Info: b.info, Rate: b.rate}
	ref1, ref2 := b.target(1), b.target(2)
	for _, t := range b.targets {
		s := &summary{ID: t.s.ID, Name: t.s.Name, Label: t.s.Label, Limit: t.limit, Stats: t.stats, Note: t.note, Sat: t.sat, Lat: t.lat, Half: t.half}
		if t.s.Kind == kindNone {
			s.Limit = limit{}
		}
		// A round whose run got no answer (Requests or Samples 0) is left
		// out of every figure that needs that run.
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
		sat := func(x *target, i int, v float64) float64 {
			if x.sat[i].Requests == 0 {
				return math.NaN()
			}
			return v
		}
		lat := func(x *target, i int, v float64) float64 {
			if x.lat[i].Samples == 0 {
				return math.NaN()
			}
			return v
		}
		s.Throughput = col(func(i int) float64 { return sat(t, i, t.sat[i].Throughput) })
		s.Rejected = col(func(i int) float64 { return sat(t, i, t.sat[i].Rejected) })
		s.CPUSat = col(func(i int) float64 { return sat(t, i, t.sat[i].CPUPerReqUS) })
		s.Capacity = col(func(i int) float64 { return sat(t, i, 1e6/t.sat[i].CPUPerReqUS) })
		s.CPULat = col(func(i int) float64 { return lat(t, i, t.lat[i].CPUPerReqUS) })
		s.P50 = col(func(i int) float64 { return lat(t, i, t.lat[i].P50US) })
		if len(t.half) == len(t.sat) {
			s.HalfP50 = col(func(i int) float64 { return t.half[i].P50US })
		}
		s.P90 = col(func(i int) float64 { return lat(t, i, t.lat[i].P90US) })
		s.P99 = col(func(i int) float64 { return lat(t, i, t.lat[i].P99US) })
		s.Achieved = col(func(i int) float64 { return t.lat[i].Achieved })
		s.Late = col(func(i int) float64 { return lat(t, i, t.lat[i].Late) })
		s.Dropped = col(func(i int) float64 { return t.lat[i].Dropped })
		s.BusyLat = col(func(i int) float64 { return lat(t, i, t.lat[i].Achieved*t.lat[i].CPUPerReqUS/1e6) })
		s.RejectedLat = col(func(i int) float64 { return lat(t, i, t.lat[i].Rejected) })
		s.RSSMiB = col(func(i int) float64 { return float64(t.rss[i]) / (1 << 20) })
		s.Core0Other = col(func(i int) float64 { return (t.sat[i].Core0Other + t.lat[i].Core0Other) / 2 })
		s.Core1Other = col(func(i int) float64 { return (t.sat[i].Core1Other + t.lat[i].Core1Other) / 2 })
		s.Core1Busy = col(func(i int) float64 { return lat(t, i, t.lat[i].Core1Busy) })
		if ref1 != nil {
			s.has1 = true
			s.ThrVs1 = col(func(i int) float64 { return sat(ref1, i, t.sat[i].Throughput/ref1.sat[i].Throughput) })
			s.CPUVs1 = col(func(i int) float64 { return sat(t, i, sat(ref1, i, t.sat[i].CPUPerReqUS/ref1.sat[i].CPUPerReqUS)) })
			s.CapVs1 = col(func(i int) float64 { return sat(t, i, sat(ref1, i, ref1.sat[i].CPUPerReqUS/t.sat[i].CPUPerReqUS)) })
			s.AddP50Vs1 = col(func(i int) float64 { return lat(t, i, lat(ref1, i, t.lat[i].P50US-ref1.lat[i].P50US)) })
			s.AddP99Vs1 = col(func(i int) float64 { return lat(t, i, lat(ref1, i, t.lat[i].P99US-ref1.lat[i].P99US)) })
		}
		if ref2 != nil {
			s.has2 = true
			s.ThrVs2 = col(func(i int) float64 { return sat(ref2, i, t.sat[i].Throughput/ref2.sat[i].Throughput) })
			s.CPUVs2 = col(func(i int) float64 { return sat(t, i, sat(ref2, i, t.sat[i].CPUPerReqUS/ref2.sat[i].CPUPerReqUS)) })
			s.CapVs2 = col(func(i int) float64 { return sat(t, i, sat(ref2, i, ref2.sat[i].CPUPerReqUS/t.sat[i].CPUPerReqUS)) })
			s.AddP50Vs2 = col(func(i int) float64 { return lat(t, i, lat(ref2, i, t.lat[i].P50US-ref2.lat[i].P50US)) })
			s.AddP99Vs2 = col(func(i int) float64 { return lat(t, i, lat(ref2, i, t.lat[i].P99US-ref2.lat[i].P99US)) })
		}
		rep.Results = append(rep.Results, s)
	}
	return rep
}

// leaseTargets are issue 13's goals for (11), the cluster rule in lease
// mode, against the local rule (3): medians of one run.
func (r *report) leaseTargets(p3 *summary, atMost, atLeast func(spread, float64) string) []string {
	p11 := r.result(11)
	if p11 == nil || p11.CPUSat.N == 0 || p3.CPUSat.Median <= 0 {
		return nil
	}
	ratio := func(a, b spread) spread {
		return spread{N: 1, Median: a.Median / b.Median, Min: a.Median / b.Median, Max: a.Median / b.Median}
	}
	cpu, thr, p50 := ratio(p11.CPUSat, p3.CPUSat), ratio(p11.Throughput, p3.Throughput), ratio(p11.HalfP50, p3.HalfP50)
	out := []string{
		fmt.Sprintf("Issue 13: Envoy CPU per request (11) ÷ (3) = %.3f (%s against %s µs), target ≤ 1.1: %s", cpu.Median, fm(p11.CPUSat, 1), fm(p3.CPUSat, 1), atMost(cpu, 1.1)),
		fmt.Sprintf("Issue 13: throughput (11) ÷ (3) = %.3f, target ≥ 0.9: %s", thr.Median, atLeast(thr, 0.9)),
		fmt.Sprintf("Issue 13: p50 at half of (3)'s saturated throughput, (11) ÷ (3) = %.3f (%s against %s µs), target within 10%%: %s", p50.Median, fm(p11.HalfP50, 0), fm(p3.HalfP50, 0), atMost(spread{N: 1, Median: math.Abs(p50.Median - 1), Min: math.Abs(p50.Median - 1), Max: math.Abs(p50.Median - 1)}, 0.1)),
	}
	lease := setups[len(setups)-1] // (11)
	if n := p11.Stats[lease.allowedStat()] + p11.Stats[lease.rejectedStat()]; n > 0 {
		per := 1000 * float64(p11.Stats[leaseCallsStat]) / float64(n)
		out = append(out, fmt.Sprintf("Issue 13: limitd calls per 1000 requests in (11) = %.2f (%d lease calls for %d requests on one hot key, over the whole benchmark; (6) makes 1000), target ≤ 10: %s",
			per, p11.Stats[leaseCallsStat], n, atMost(spread{N: 1, Median: per, Min: per, Max: per}, 10)))
	}
	return out
}

func (r *report) result(id int) *summary {
	for _, s := range r.Results {
		if s.ID == id {
			return s
		}
	}
	return nil
}

// f formats a spread as "median (min–max)" with prec decimals.
func f(s spread, prec int) string {
	if s.N == 0 {
		return "–"
	}
	if s.N == 1 || s.Min == s.Max {
		return fmt.Sprintf("%.*f", prec, s.Median)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, s.Median, prec, s.Min, prec, s.Max)
}

// fm formats only the median.
func fm(s spread, prec int) string {
	if s.N == 0 {
		return "–"
	}
	return fmt.Sprintf("%.*f", prec, s.Median)
}

func fsigned(s spread, prec int) string {
	if s.N == 0 {
		return "–"
	}
	if s.N == 1 || s.Min == s.Max {
		return fmt.Sprintf("%+.*f", prec, s.Median)
	}
	return fmt.Sprintf("%+.*f (%+.*f…%+.*f)", prec, s.Median, prec, s.Min, prec, s.Max)
}

func pct(s spread) string {
	if s.N == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", 100*s.Median)
}

// targets are issue 11's goals, then issue 7's and issue 13's, checked against the
// medians.
func (r *report) targets() []string {
	p3 := r.result(3)
	if p3 == nil {
		return nil
	}
	// A target is met when every round met it, not met when no round did,
	// and inconclusive otherwise: the machine's noise then decides.
	atMost := func(s spread, target float64) string {
		switch {
		case s.N == 0:
			return "**not measured**"
		case s.Max <= target:
			return "**met**"
		case s.Min > target:
			return "**not met**"
		}
		return "**inconclusive** (rounds on both sides)"
	}
	atLeast := func(s spread, target float64) string {
		switch {
		case s.N == 0:
			return "**not measured**"
		case s.Min >= target:
			return "**met**"
		case s.Max < target:
			return "**not met**"
		}
		return "**inconclusive** (rounds on both sides)"
	}
	var out []string
	// Issue 11: within 10 µs of a Wasm filter that does nothing, and 0.85 of
	// no filter's throughput; the rejecting plugin at 0.85 of the rejecting
	// native filter. Differences and ratios of medians.
	if p9 := r.result(9); p9 != nil && p9.CPUSat.N > 0 {
		d := p3.CPUSat.Median - p9.CPUSat.Median
		verdict := "**met**"
		if d > 10 {
			verdict = "**not met**"
		}
		out = append(out, fmt.Sprintf("Issue 11: Envoy CPU per request (3) − (9) = %+.1f µs (medians: %s against %s), target ≤ +10 µs: %s (where it goes, and the floor of any module making the plugin's host calls, measured within one Envoy: attribution.md and footprint.md)",
			d, fm(p3.CPUSat, 1), fm(p9.CPUSat, 1), verdict))
	}
	if p3.has1 {
		out = append(out, fmt.Sprintf("Issue 11: throughput (3) ÷ (1) = %s, target ≥ 0.85: %s (the ratio any module making the plugin's host calls reaches at most: attribution.md)", f(p3.ThrVs1, 3), atLeast(p3.ThrVs1, 0.85)))
	}
	if p4, p5 := r.result(4), r.result(5); p4 != nil && p5 != nil && p5.Throughput.Median > 0 {
		ratio := p4.Throughput.Median / p5.Throughput.Median
		verdict := "**met**"
		if ratio < 0.85 {
			verdict = "**not met**"
		}
		out = append(out, fmt.Sprintf("Issue 11: throughput (4) ÷ (5) = %.3f (medians), target ≥ 0.85: %s (the Go floor rejecting half, with no decision, against (5): attribution.md)", ratio, verdict))
	}
	if p3.has1 {
		out = append(out,
			fmt.Sprintf("Throughput (3) ÷ (1): measured %s, target ≥ 0.90: %s; per Envoy core (1 / CPU per request, which the shared machine disturbs less) %s: %s", f(p3.ThrVs1, 3), atLeast(p3.ThrVs1, 0.90), f(p3.CapVs1, 3), atLeast(p3.CapVs1, 0.90)),
			fmt.Sprintf("Added p50 latency (3) − (1) at %.0f req/s = %s µs, target ≤ 5 µs: %s", r.Rate, fsigned(p3.AddP50Vs1, 1), atMost(p3.AddP50Vs1, 5)),
			fmt.Sprintf("Added p99 latency (3) − (1) at %.0f req/s = %s µs, target ≤ 50 µs: %s", r.Rate, fsigned(p3.AddP99Vs1, 1), atMost(p3.AddP99Vs1, 50)))
	}
	if p3.has2 {
		out = append(out, fmt.Sprintf("Throughput (3) ÷ (2): measured %s, target ≥ 0.95: %s; per Envoy core %s: %s", f(p3.ThrVs2, 3), atLeast(p3.ThrVs2, 0.95), f(p3.CapVs2, 3), atLeast(p3.CapVs2, 0.95)))
	}
	out = append(out, r.leaseTargets(p3, atMost, atLeast)...)
	if p3.has1 {
		out = append(out, fmt.Sprintf("Envoy CPU per request (3) ÷ (1) = %s at saturation (%s µs against %s µs)", f(p3.CPUVs1, 2), fm(p3.CPUSat, 1), fm(r.result(1).CPUSat, 1)))
	}
	if p3.has2 {
		out = append(out, fmt.Sprintf("Envoy CPU per request (3) ÷ (2) = %s at saturation (%s µs against %s µs)", f(p3.CPUVs2, 2), fm(p3.CPUSat, 1), fm(r.result(2).CPUSat, 1)))
	}
	return out
}

// summary is the short text printed at the end of a run.
func (r *report) summary() string {
	var b strings.Builder
	for _, s := range r.Results {
		fmt.Fprintf(&b, "(%d) %-30s %8.0f req/s  p50 %6.1f µs  p99 %7.1f µs  CPU %5.1f µs/req  RSS %5.1f MiB\n",
			s.ID, s.Label, s.Throughput.Median, s.P50.Median, s.P99.Median, s.CPUSat.Median, s.RSSMiB.Median)
	}
	for _, t := range r.targets() {
		b.WriteString(strings.ReplaceAll(t, "**", "") + "\n")
	}
	for _, g := range r.Info.Gaps {
		b.WriteString("gap: " + g + "\n")
	}
	return b.String()
}

func (r *report) markdown() string {
	var b strings.Builder
	in := r.Info
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Overhead benchmark\n\n")
	w("Generated by `make bench` ([cmd/bench](../../cmd/bench)) on %s in %s; do not edit by hand.", in.Date, in.Duration)
	if in.Smoke {
		w(" **Smoke run**: one short round, figures are indicative only.")
	}
	w("\n\nThe same Envoy binary, listener, route, upstream and `--concurrency 1`, with:\n\n")
	for _, s := range r.Results {
		w("- (%d) %s%s\n", s.ID, s.Label, describe(s))
	}
	for _, g := range in.Gaps {
		w("\n**Gap:** %s\n", g)
	}
	w("\n## Against the targets (issues 7, 11 and 13)\n\n")
	for _, t := range r.targets() {
		w("- %s\n", t)
	}
	w("\nMedians across %d rounds, the range (min–max) in brackets; ratios and differences are taken within each round, then summarised.\n", in.Rounds)

	w("\n## Throughput and Envoy CPU\n\n")
	w("Closed loop, %d keep-alive connections, saturating Envoy's one worker. CPU is Envoy's utime + stime per request over the %s window.\n\n", in.Conns, in.SatWindow)
	w("| # | configuration | saturated req/s | ÷ (1) | ÷ (2) | rejected | Envoy CPU µs/req | ÷ (1) | ÷ (2) | req/s per Envoy core | ÷ (1) | ÷ (2) | Envoy CPU µs/req at %.0f req/s | Envoy RSS MiB |\n", r.Rate)
	w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Results {
		w("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.ID, s.Label, f(s.Throughput, 0),
			f(s.ThrVs1, 3), f(s.ThrVs2, 3), pct(s.Rejected), f(s.CPUSat, 1), f(s.CPUVs1, 2), f(s.CPUVs2, 2),
			f(s.Capacity, 0), fm(s.CapVs1, 3), fm(s.CapVs2, 3), f(s.CPULat, 1), f(s.RSSMiB, 1))
	}
	w("\n*req/s per Envoy core* is 1 / (Envoy CPU per request): the throughput Envoy would reach with its core to itself. On this shared machine it is the steadier comparison; measured throughput also moves with how much of its core Envoy got.\n")
	r.breakdown(w)
	w("\n## Latency at a fixed rate\n\n")
	w("Open loop at %.0f req/s (%.0f%% of the no-filter saturated throughput measured in calibration), %d connections; latency from writing the request to reading the whole response, every sample of the %s window. A send counts as late when it started more than 1 ms behind its schedule (the connection was still busy, or the generator's CPU was taken); a connection more than 100 ms behind skips the sends it missed (dropped). Latency runs from the actual send, so late and dropped sends are the sign that the rate was not met and the percentiles understate the wait.\n\n", r.Rate, 100*in.Load, in.OpenConns, in.LatWindow)
	saturatedGen := 0
	for _, s := range r.Results {
		if s.Core1Busy.N > 0 && s.Core1Busy.Median >= 0.95 {
			saturatedGen++
		}
	}
	if saturatedGen > 0 {
		w("**Caution:** in %d of %d configurations the load generator's CPU (CPU 1: generator, upstream and the kernel's loopback work) was at least 95%% busy during these runs (see Noise), so the generator itself queued requests: these latencies are upper bounds, and only their differences say something about the filters.\n\n", saturatedGen, len(r.Results))
	}
	w("*Envoy busy* is the share of its core Envoy used at this rate (CPU per request × rate): near 100%% a configuration is close to its own saturation and queueing dominates its latency.\n\n")
	w("| # | configuration | p50 µs | p90 µs | p99 µs | p50 − (1) µs | p99 − (1) µs | p50 − (2) µs | p99 − (2) µs | achieved req/s | Envoy busy | rejected | late sends | dropped sends |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Results {
		w("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.ID, s.Label, f(s.P50, 0), f(s.P90, 0), f(s.P99, 0),
			fsigned(s.AddP50Vs1, 1), fsigned(s.AddP99Vs1, 0), fsigned(s.AddP50Vs2, 1), fsigned(s.AddP99Vs2, 0), fm(s.Achieved, 0), pct(s.BusyLat), pct(s.RejectedLat), pct(s.Late), pct(s.Dropped))
	}
	w("\n![saturated throughput](throughput.png)\n\n![latency at a fixed rate](latency.png)\n\n![Envoy CPU per request](cpu.png)\n\n![Envoy RSS](rss.png)\n")

	var plug []*summary
	for _, s := range r.Results {
		if _, ok := s.Stats["wasmcustom.tokenbucket.memory.gc_cycles"]; ok {
			plug = append(plug, s)
		}
	}
	if len(plug) > 0 {
		w("\n## Inside the plugin\n\n")
		w("From each plugin Envoy's `/stats` at the end of the run (the memory gauges are the Go runtime's figures of the worker's Wasm VM, updated every second):\n\n")
		w("| # | configuration | requests | guest GC cycles | requests per GC | guest heap KiB | CAS retries | limit-service errors |\n|---|---|---|---|---|---|---|---|\n")
		for _, s := range plug {
			rq, gc := s.Stats["http.ingress.downstream_rq_total"], s.Stats["wasmcustom.tokenbucket.memory.gc_cycles"]
			per := "–"
			if gc > 0 {
				per = fmt.Sprintf("%.0f", float64(rq)/float64(gc))
			}
			w("| %d | %s | %d | %d | %s | %.0f | %d | %d |\n", s.ID, s.Label, rq, gc, per,
				float64(s.Stats["wasmcustom.tokenbucket.memory.heap_bytes"])/1024,
				s.Stats["wasmcustom.tokenbucket.cas_retries"], s.Stats["wasmcustom.tokenbucket.service_errors"])
		}
		w("\nHost calls, guest function calls and allocations per request are profiled separately in wazero: `make bench-profile` (cmd/bench/profile_test.go); see [profile.md](profile.md).\n")
	}

	w("\n## Noise\n\n")
	w("The machine is shared: other processes (builds, tests) ran during the benchmark. Load average %s at the start, %s at the end. ", in.Machine.LoadAvg, in.Machine.LoadEnd)
	w("Share of each pinned CPU not used by our processes while a configuration was measured (median across rounds): busy time from /proc/stat minus the CPU time of Envoy (CPU 0) or of this program and limitd (CPU 1). It counts other processes and interrupt handling (which includes some of the kernel's work for the loopback traffic itself).\n\n")
	w("| | %s |\n|---|%s\n", strings.Join(ids(r), " | "), strings.Repeat("---|", len(r.Results)))
	w("| Envoy's CPU (0) | %s |\n", strings.Join(columns(r, func(s *summary) string { return pct(s.Core0Other) }), " | "))
	w("| load generator's CPU (1) | %s |\n", strings.Join(columns(r, func(s *summary) string { return pct(s.Core1Other) }), " | "))
	w("| CPU 1 busy in all during the fixed-rate run | %s |\n\n", strings.Join(columns(r, func(s *summary) string { return pct(s.Core1Busy) }), " | "))
	w("When CPU 1 is near 100%% busy in the fixed-rate runs, the load generator itself adds to the latency measured (and makes sends late); the latency figures are then upper bounds.\n\n")
	if len(in.Starved) > 0 {
		w("Runs that got no answer at all while other processes held the CPUs, left out of every figure: %s.\n\n", strings.Join(in.Starved, "; "))
	}
	w("Throughput and latency move with that load; Envoy's CPU per request moves least, which makes it the steadiest measure of overhead. The ranges in the tables show the spread across rounds.\n")

	w("\n## Machine and versions\n\n")
	w("- Machine: %d CPUs, %s, Linux %s, %s RAM\n", in.Machine.CPUs, in.Machine.CPUModel, in.Machine.Kernel, in.Machine.MemTotal)
	w("- Pinning: %s\n", in.Pinning)
	w("- Envoy: %s\n", in.Envoy)
	w("- Plugin: %s\n", in.Plugin)
	if in.Limitd != "" {
		w("- Limit service: %s\n", in.Limitd)
	}
	w("- Load generator: cmd/bench, %s\n", in.Go)

	w("\n## Method\n\n")
	w("- Load: an in-process HTTP/1.1 keep-alive generator on loopback (internal/loadgen) sending `GET /bench` with `x-api-key` cycling through %d values; the upstream is a minimal in-process HTTP/1.1 server answering 200 `ok`. Both do little per request, so the generator's CPU is not the limit.\n", in.Keys)
	w("- Each round runs every configuration once: a saturation run (%s warm-up, %s measured), then a fixed-rate run (%s warm-up, %s measured). The order is reversed every other round so that drift cancels.\n", in.Warmup, in.SatWindow, in.Warmup, in.LatWindow)
	w("- All Envoys run side by side for the whole benchmark (idle ones cost nothing measurable) and are checked at the end through `/stats`: every limiter counted its decisions, the never-rejecting ones rejected nothing, no request failed.\n")
	w("- Calibration, before the rounds: %s.\n", strings.Join(in.Calibration, "; "))
	w("- The rejecting configurations (4) and (5) give every key the same token bucket (rate = burst, whole tokens per second, as the native filter requires). Their limit is computed to reject half of a closed loop's requests when Envoy gets 85%% of its core (a little more than half with all of it); with less of it (see Noise) a closed loop rejects less, so the rejected share is reported per configuration. Their fixed-rate runs spread the offered rate over as many keys as make it twice the per-key limit, which rejects half. Before measuring, each is checked to limit per key (one key sent past its burst is rejected, a fresh key is not).\n")
	w("- The plugin runs with its default response headers (RateLimit and RateLimit-Policy drafts plus X-RateLimit legacy ones); the native filter adds none (`enable_x_ratelimit_headers` unset).\n")
	w("- Raw data, every run of every round: [results.json](results.json).\n")
	return b.String()
}

// breakdown splits the plugin's extra CPU per request into parts, from the
// diagnostic configurations, when they ran: per-round differences of Envoy
// CPU per request at saturation.
func (r *report) breakdown(w func(string, ...any)) {
	get := func(id int) *summary { return r.result(id) }
	s1, s2, s3, s7, s8, s9 := get(1), get(2), get(3), get(7), get(8), get(9)
	if s1 == nil || s3 == nil || s7 == nil || s8 == nil || s9 == nil {
		return
	}
	diff := func(a, b *summary) spread {
		n := min(len(a.Sat), len(b.Sat))
		xs := make([]float64, n)
		for i := range n {
			xs[i] = a.Sat[i].CPUPerReqUS - b.Sat[i].CPUPerReqUS
			if a.Sat[i].Requests == 0 || b.Sat[i].Requests == 0 {
				xs[i] = math.NaN()
			}
		}
		return spreadOf(xs)
	}
	w("\n### Where the plugin's CPU goes\n\n")
	w("Differences of Envoy CPU per request at saturation between configurations, within each round (µs, median and range). Each part is the difference of two noisy measurements: on a shared machine a part's range spans tens of µs and parts move between runs; the total is the steady figure. The request path's exact counts (host calls, allocations, Go calls) are in [profile.md](profile.md).\n\n")
	w("| part | from | µs per request |\n|---|---|---|\n")
	rows := []struct {
		part, from string
		d          spread
	}{
		{"any Wasm filter: Envoy's Wasm filter and V8 calling a module whose callbacks do nothing", "(9) − (1)", diff(s9, s1)},
		{"the Go plugin idle: Go runtime and SDK in its callbacks, one header read", "(7) − (9)", diff(s7, s9)},
		{"the decision: limit key hash, shared-data read and CAS write, metric", "(8) − (7)", diff(s8, s7)},
		{"the RateLimit response headers (5 host calls, formatting)", "(3) − (8)", diff(s3, s8)},
		{"**the plugin in all**", "(3) − (1)", diff(s3, s1)},
	}
	if s10 := get(10); s10 != nil {
		rows = append(rows, struct {
			part, from string
			d          spread
		}{fmt.Sprintf("for scale: %d host calls from a no-op module", nullHostCalls), "(10) − (9)", diff(s10, s9)})
	}
	if s2 != nil {
		rows = append(rows, struct {
			part, from string
			d          spread
		}{"for comparison: Envoy's native local_ratelimit", "(2) − (1)", diff(s2, s1)})
	}
	for _, row := range rows {
		w("| %s | %s | %s |\n", row.part, row.from, fsigned(row.d, 1))
	}
}

func ids(r *report) []string {
	return columns(r, func(s *summary) string { return fmt.Sprintf("(%d)", s.ID) })
}

func columns(r *report, f func(*summary) string) []string {
	var out []string
	for _, s := range r.Results {
		out = append(out, f(s))
	}
	return out
}

func describe(s *summary) string {
	switch {
	case s.Name == "plugin-idle":
		return ": the plugin with its rule behind a condition no request meets (it reads one header per request and decides nothing): the fixed cost of a Go Wasm filter"
	case s.Name == "null-wasm":
		return ": the same Wasm filter and V8 VM running a hand-made module whose callbacks do nothing (it exports the same callbacks as the plugin, so Envoy calls it as often): what any Wasm filter costs before its code runs"
	case s.Name == "null-wasm-calls":
		return fmt.Sprintf(": the module of (9) calling the host %d times per request (WASI clock_time_get, which the plugin also calls): (10) − (9) is what that many calls from a module into Envoy cost", nullHostCalls)
	case s.Name == "plugin-noheaders":
		return `: the plugin as in (3) with "headers": "none" (no RateLimit headers on responses)`
	case s.ID == 1:
		return ": the router alone"
	case s.Name == "cluster-lease":
		return `: a cluster rule with "sync": "lease" and no limit keys (one bucket for every request: one hot key) that never empties (10⁹ tokens/s), spent from this Envoy's lease in shared data`
	case s.Limit.Rate >= neverLimit:
		return ", one bucket per x-api-key value that never empties (10⁹ tokens/s)"
	default:
		return fmt.Sprintf(", one bucket per x-api-key value: %d tokens/s, burst %d", s.Limit.Rate, s.Limit.Burst)
	}
}

// readReport loads a report written by write, to render it again.
func readReport(path string) (*report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", path, err)
	}
	has1, has2 := r.result(1) != nil, r.result(2) != nil
	for _, s := range r.Results {
		s.has1, s.has2 = has1, has2
	}
	return &r, nil
}

// write stores README.md, results.json and the plots in dir.
func (r *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"README.md":    []byte(r.markdown()),
		"results.json": append(js, '\n'),
	}
	for name, ch := range r.charts() {
		img, err := ch.png()
		if err != nil {
			return fmt.Errorf("bench: %s: %w", name, err)
		}
		files[name] = img
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (r *report) charts() map[string]chart {
	var cats []string
	for _, s := range r.Results {
		cats = append(cats, fmt.Sprintf("(%d)\n%s", s.ID, plotLabel(s.ID)))
	}
	pick := func(g func(*summary) spread) []spread {
		var out []spread
		for _, s := range r.Results {
			out = append(out, g(s))
		}
		return out
	}
	return map[string]chart{
		"throughput.png": {
			Title: "Saturated throughput, Envoy --concurrency 1", YLabel: "req/s", Categories: cats,
			Series: []series{
				{Name: "measured", Color: palette[0], Values: pick(func(s *summary) spread { return s.Throughput })},
				{Name: "per Envoy core (1 / CPU per request)", Color: palette[2], Values: pick(func(s *summary) spread { return s.Capacity })},
			},
		},
		"latency.png": {
			Title: fmt.Sprintf("Latency at %.0f req/s (open loop), log scale", r.Rate), YLabel: "µs", Categories: cats, Log: true,
			Series: []series{
				{Name: "p50", Color: palette[0], Values: pick(func(s *summary) spread { return s.P50 })},
				{Name: "p90", Color: palette[1], Values: pick(func(s *summary) spread { return s.P90 })},
				{Name: "p99", Color: palette[2], Values: pick(func(s *summary) spread { return s.P99 })},
			},
		},
		"cpu.png": {
			Title: "Envoy CPU per request", YLabel: "µs CPU/req", Categories: cats,
			Series: []series{
				{Name: "saturated", Color: palette[0], Values: pick(func(s *summary) spread { return s.CPUSat })},
				{Name: fmt.Sprintf("at %.0f req/s", r.Rate), Color: palette[1], Values: pick(func(s *summary) spread { return s.CPULat })},
			},
		},
		"rss.png": {
			Title: "Envoy resident memory (VmRSS)", YLabel: "MiB", Categories: cats,
			Series: []series{{Name: "MiB", Color: palette[3], Values: pick(func(s *summary) spread { return s.RSSMiB })}},
		},
	}
}

func plotLabel(id int) string {
	for _, s := range setups {
		if s.ID == id {
			return s.Plot
		}
	}
	return ""
}
