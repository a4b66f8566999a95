// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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
	CPULatVs1   spread            `json:"cpu_per_req_fixed_rate_ratio_vs_1"` // CPULat ÷ no filter's, within each round
	CPULatVs2   spread            `json:"cpu_per_req_fixed_rate_ratio_vs_2"` // CPULat ÷ native local_ratelimit's
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
	// Startups are Envoy's starts with no filter, the plugin and the
	// native module (bench.starts).
	Startups []startup `json:"startups,omitempty"`
	// RLS is the section on Envoy's ratelimit filter (rls.go).
	RLS *rlsReport `json:"rls,omitempty"`
	// RLQS is the section on Envoy's quota filter (rlqs.go).
	RLQS *rlqsReport `json:"rlqs,omitempty"`
}

func (b *bench) report() *report {
	rep := &report{Info: b.info, Rate: b.rate, Startups: b.startups, RLS: b.rls, RLQS: b.rlqs}
	for _, t := range b.targets {
		// A configuration with Envoy on any CPU compares with no filter on
		// any CPU, and with no native local_ratelimit.
		ref1, ref2 := b.target(1), b.target(2)
		if t.s.Free {
			ref1, ref2 = b.target(13), nil
		}
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
			s.CPULatVs1 = col(func(i int) float64 { return lat(t, i, lat(ref1, i, t.lat[i].CPUPerReqUS/ref1.lat[i].CPUPerReqUS)) })
			s.AddP50Vs1 = col(func(i int) float64 { return lat(t, i, lat(ref1, i, t.lat[i].P50US-ref1.lat[i].P50US)) })
			s.AddP99Vs1 = col(func(i int) float64 { return lat(t, i, lat(ref1, i, t.lat[i].P99US-ref1.lat[i].P99US)) })
		}
		if ref2 != nil {
			s.has2 = true
			s.ThrVs2 = col(func(i int) float64 { return sat(ref2, i, t.sat[i].Throughput/ref2.sat[i].Throughput) })
			s.CPUVs2 = col(func(i int) float64 { return sat(t, i, sat(ref2, i, t.sat[i].CPUPerReqUS/ref2.sat[i].CPUPerReqUS)) })
			s.CapVs2 = col(func(i int) float64 { return sat(t, i, sat(ref2, i, ref2.sat[i].CPUPerReqUS/t.sat[i].CPUPerReqUS)) })
			s.CPULatVs2 = col(func(i int) float64 { return lat(t, i, lat(ref2, i, t.lat[i].CPUPerReqUS/ref2.lat[i].CPUPerReqUS)) })
			s.AddP50Vs2 = col(func(i int) float64 { return lat(t, i, lat(ref2, i, t.lat[i].P50US-ref2.lat[i].P50US)) })
			s.AddP99Vs2 = col(func(i int) float64 { return lat(t, i, lat(ref2, i, t.lat[i].P99US-ref2.lat[i].P99US)) })
		}
		rep.Results = append(rep.Results, s)
	}
	return rep
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

// label is a configuration's name in the pages: the current one of
// setups for its ID (so that -render renames old results), else the one
// recorded.
func label(s *summary) string {
	for _, st := range setups {
		if st.ID == s.ID {
			return st.Label
		}
	}
	return s.Label
}

// meaning says what the figures mean for a user, for the configurations a
// user chooses between: requests one Envoy core serves, Envoy CPU added per
// request, latency added at a fixed load, memory, and for leases the calls
// to limitd. Medians; ratios and differences within each round.
func (r *report) meaning() []string {
	none := r.result(1)
	if none == nil {
		return nil
	}
	var out []string
	for _, id := range []int{2, 3, 12, 6, 11} {
		s := r.result(id)
		if s == nil || s.CapVs1.N == 0 {
			continue
		}
		one := func(v float64) spread { return spread{N: 1, Median: v, Min: v, Max: v} }
		line := fmt.Sprintf("**%s:** one Envoy core serves %s times the requests it serves with no filter (%s against %s a second). Against no filter: Envoy CPU per request %s µs",
			label(s), fm(s.CapVs1, 2), fm(s.Capacity, 0), fm(none.Capacity, 0), fsigned(one(s.CPUSat.Median-none.CPUSat.Median), 1))
		if s.AddP50Vs1.N > 0 {
			line += fmt.Sprintf("; at %.0f requests a second (its worker %s busy), latency %s µs at the median and %s µs at the 99th percentile",
				r.Rate, pct(s.BusyLat), fsigned(one(s.AddP50Vs1.Median), 0), fsigned(one(s.AddP99Vs1.Median), 0))
		}
		if s.RSSMiB.N > 0 && none.RSSMiB.N > 0 {
			line += fmt.Sprintf("; resident memory %s MiB", fsigned(one(s.RSSMiB.Median-none.RSSMiB.Median), 0))
		}
		if id == 11 {
			lease, _ := setupByID(11)
			if n := s.Stats[lease.allowedStat()] + s.Stats[lease.rejectedStat()]; n > 0 {
				line += fmt.Sprintf(". It called limitd %.2f times per 1000 requests on one hot key (a cluster rule per request calls it 1000 times)",
					1000*float64(s.Stats[leaseCallsStat])/float64(n))
			}
		}
		out = append(out, line+".")
	}
	return out
}

// summary is the short text printed at the end of a run.
func (r *report) summary() string {
	var b strings.Builder
	for _, s := range r.Results {
		fmt.Fprintf(&b, "%-36s %8.0f req/s  p50 %6.1f µs  p99 %7.1f µs  CPU %5.1f µs/req  RSS %5.1f MiB\n",
			label(s), s.Throughput.Median, s.P50.Median, s.P99.Median, s.CPUSat.Median, s.RSSMiB.Median)
	}
	for _, t := range r.meaning() {
		b.WriteString(strings.ReplaceAll(t, "**", "") + "\n")
	}
	for _, g := range r.Info.Gaps {
		b.WriteString("gap: " + g + "\n")
	}
	b.WriteString(r.rlsSummary())
	b.WriteString(r.rlqsSummary())
	return b.String()
}

// rlsSummary is the RLS section's short text.
func (r *report) rlsSummary() string {
	if r.RLS == nil {
		return ""
	}
	var b strings.Builder
	for _, s := range r.RLS.Results {
		fmt.Fprintf(&b, "%-58s %8.0f req/s  service+redis CPU %5.1f µs/req  p99 %7.0f µs (%+.0f)\n",
			s.Label, s.Throughput.Median, s.Decision.Median, s.P99.Median, s.AddP99.Median)
	}
	for _, g := range r.RLS.Gaps {
		b.WriteString("gap: " + g + "\n")
	}
	return b.String()
}

func (r *report) markdown() string {
	var b strings.Builder
	in := r.Info
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# What rate limiting costs in Envoy\n\n")
	w("Generated by `make bench` ([bench/cmd/bench](../../bench/cmd/bench)) on %s in %s; do not edit by hand.", in.Date, in.Duration)
	if in.Smoke {
		w(" **Smoke run**: one short round, figures are indicative only.")
	}
	if len(r.Results) == 0 && (r.RLS != nil || r.RLQS != nil) {
		// -rls-only or -rlqs-only with no report to put the section into.
		w("\n")
		if r.RLS != nil {
			r.RLS.section(w)
		}
		if r.RLQS != nil {
			r.RLQS.section(w)
		}
		return b.String()
	}
	w("\n\n## What it means for you\n\n")
	w("Envoy ran with one worker (`--concurrency 1`) on a core of its own. *Requests one Envoy core serves* is 1 ÷ (Envoy's CPU per request) with the worker saturated: a worker serves that many requests a second at most, and for the same traffic a fleet needs 1 ÷ (the ratio to no filter) times the Envoy CPU it needs with no filter. Latency is measured at a fixed load, half of what Envoy with no filter serves: a configuration whose worker is nearly always busy at that load queues requests, which is most of its added latency.\n\n")
	for _, t := range r.meaning() {
		w("- %s\n", t)
	}
	w("\nWhere the plugin's CPU goes, layer by layer, is measured in [attribution.md](attribution.md), and the plugin's and the native module's at ordinary load in [ordinary.md](ordinary.md); start time and module size in [footprint.md](../../bench/footprint.md). Medians across %d rounds; ratios and differences are taken within each round, then summarised.\n", in.Rounds)
	w("\n## The configurations\n\nThe same Envoy binary, listener, route, upstream and `--concurrency 1`, with:\n\n")
	for _, s := range r.Results {
		w("- **%s**%s\n", label(s), describe(s))
	}
	for _, g := range in.Gaps {
		w("\n**Gap:** %s\n", named(g))
	}
	w("\nIn the tables, *÷ none* compares with no filter and *÷ native* with native local_ratelimit; the range (min–max) across rounds is in brackets.\n")

	w("\n## Throughput and Envoy CPU\n\n")
	w("Closed loop, %d keep-alive connections, saturating Envoy's one worker. CPU is Envoy's utime + stime per request over the %s window.\n\n", in.Conns, in.SatWindow)
	w("| configuration | saturated req/s | ÷ none | ÷ native | rejected | Envoy CPU µs/req | ÷ none | ÷ native | req/s per Envoy core | ÷ none | ÷ native | ordinary load: Envoy CPU µs/req at %.0f req/s | ÷ none | ÷ native | Envoy RSS MiB |\n", r.Rate)
	w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Results {
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label(s), f(s.Throughput, 0),
			f(s.ThrVs1, 3), f(s.ThrVs2, 3), pct(s.Rejected), f(s.CPUSat, 1), f(s.CPUVs1, 2), f(s.CPUVs2, 2),
			f(s.Capacity, 0), fm(s.CapVs1, 3), fm(s.CapVs2, 3), f(s.CPULat, 1), f(s.CPULatVs1, 2), f(s.CPULatVs2, 2), f(s.RSSMiB, 1))
	}
	w("\n*Ordinary load* is the fixed-rate runs of the latency section (%d keep-alive connections at %.0f req/s, Envoy's worker not saturated), where work a busy worker amortises falls on fewer requests; [ordinary.md](ordinary.md) (`make bench-ordinary`) runs that regime alone, with local_ratelimit and the native module compared like with like, and where the CPU goes.\n", in.OpenConns, r.Rate)
	w("\n*req/s per Envoy core* is 1 / (Envoy CPU per request): the throughput Envoy would reach with its core to itself. On this shared machine it is the steadier comparison; measured throughput also moves with how much of its core Envoy got.\n")
	r.breakdown(w)
	r.wasmOrNative(w)
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
	w("| configuration | p50 µs | p90 µs | p99 µs | p50 − none µs | p99 − none µs | p50 − native µs | p99 − native µs | achieved req/s | Envoy busy | rejected | late sends | dropped sends |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Results {
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label(s), f(s.P50, 0), f(s.P90, 0), f(s.P99, 0),
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
		w("| configuration | requests | guest GC cycles | requests per GC | guest heap KiB | CAS retries | limit-service errors |\n|---|---|---|---|---|---|---|\n")
		for _, s := range plug {
			rq, gc := s.Stats["http.ingress.downstream_rq_total"], s.Stats["wasmcustom.tokenbucket.memory.gc_cycles"]
			per := "–"
			if gc > 0 {
				per = fmt.Sprintf("%.0f", float64(rq)/float64(gc))
			}
			w("| %s | %d | %d | %s | %.0f | %d | %d |\n", label(s), rq, gc, per,
				float64(s.Stats["wasmcustom.tokenbucket.memory.heap_bytes"])/1024,
				s.Stats["wasmcustom.tokenbucket.cas_retries"], s.Stats["wasmcustom.tokenbucket.service_errors"])
		}
		w("\nHost calls, guest function calls and allocations per request are profiled separately in wazero: `make bench-profile` (bench/cmd/bench/profile_test.go); see [profile.md](../../bench/profile.md).\n")
	}

	if r.RLS != nil {
		r.RLS.section(w)
	}
	if r.RLQS != nil {
		r.RLQS.section(w)
	}
	w("\n%s", holdingSection)
	w("\n## Noise\n\n")
	w("The machine is shared: other processes (builds, tests) ran during the benchmark. Load average %s at the start, %s at the end. ", in.Machine.LoadAvg, in.Machine.LoadEnd)
	w("Share of each pinned CPU not used by our processes while a configuration was measured (median across rounds): busy time from /proc/stat minus the CPU time of Envoy (CPU 0) or of this program and limitd (CPU 1). It counts other processes and interrupt handling (which includes some of the kernel's work for the loopback traffic itself).\n\n")
	w("| | %s |\n|---|%s\n", strings.Join(ids(r), " | "), strings.Repeat("---|", len(r.Results)))
	w("| Envoy's CPU 0 | %s |\n", strings.Join(columns(r, func(s *summary) string { return pct(s.Core0Other) }), " | "))
	w("| load generator's CPU 1 | %s |\n", strings.Join(columns(r, func(s *summary) string { return pct(s.Core1Other) }), " | "))
	w("| CPU 1 busy in all during the fixed-rate run | %s |\n\n", strings.Join(columns(r, func(s *summary) string { return pct(s.Core1Busy) }), " | "))
	w("When CPU 1 is near 100%% busy in the fixed-rate runs, the load generator itself adds to the latency measured (and makes sends late); the latency figures are then upper bounds.\n\n")
	if len(in.Starved) > 0 {
		w("Runs that got no answer at all while other processes held the CPUs, left out of every figure: %s.\n\n", named(strings.Join(in.Starved, "; ")))
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
	w("- Load generator: bench/cmd/bench, %s\n", in.Go)

	w("\n## Method\n\n")
	w("- Load: an in-process HTTP/1.1 keep-alive generator on loopback (bench/internal/loadgen) sending `GET /bench` with `x-api-key` cycling through %d values; the upstream is a minimal in-process HTTP/1.1 server answering 200 `ok`. Both do little per request, so the generator's CPU is not the limit.\n", in.Keys)
	w("- Each round runs every configuration once: a saturation run (%s warm-up, %s measured), then a fixed-rate run (%s warm-up, %s measured). The order is reversed every other round so that drift cancels.\n", in.Warmup, in.SatWindow, in.Warmup, in.LatWindow)
	w("- All Envoys run side by side for the whole benchmark (idle ones cost nothing measurable) and are checked at the end through `/stats`: every limiter counted its decisions, the never-rejecting ones rejected nothing, no request failed.\n")
	w("- Calibration, before the rounds: %s.\n", named(strings.Join(in.Calibration, "; ")))
	w("- The rejecting configurations (plugin and native, ~50%% rejected) give every key the same token bucket (rate = burst, whole tokens per second, as the native filter requires). Their limit is computed to reject half of a closed loop's requests when Envoy gets 85%% of its core (a little more than half with all of it); with less of it (see Noise) a closed loop rejects less, so the rejected share is reported per configuration. Their fixed-rate runs spread the offered rate over as many keys as make it twice the per-key limit, which rejects half. Before measuring, each is checked to limit per key (one key sent past its burst is rejected, a fresh key is not).\n")
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
	w("Differences of Envoy CPU per request at saturation between configurations, within each round (µs, median and range). Each part is the difference of two noisy measurements: on a shared machine a part's range spans tens of µs and parts move between runs; the total is the steady figure. The request path's exact counts (host calls, allocations, Go calls) are in [profile.md](../../bench/profile.md).\n\n")
	w("| part | from | µs per request |\n|---|---|---|\n")
	rows := []struct {
		part, from string
		d          spread
	}{
		{"any Wasm filter: Envoy's Wasm filter and V8 calling a module whose callbacks do nothing", minus(s9, s1), diff(s9, s1)},
		{"the Go plugin idle: Go runtime and SDK in its callbacks, one header read", minus(s7, s9), diff(s7, s9)},
		{"the decision: limit key hash, shared-data read and CAS write, metric", minus(s8, s7), diff(s8, s7)},
		{"the RateLimit response headers (5 host calls, formatting)", minus(s3, s8), diff(s3, s8)},
		{"**the plugin in all**", minus(s3, s1), diff(s3, s1)},
	}
	if s10 := get(10); s10 != nil {
		rows = append(rows, struct {
			part, from string
			d          spread
		}{fmt.Sprintf("for scale: %d host calls from a no-op module", nullHostCalls), minus(s10, s9), diff(s10, s9)})
	}
	if s2 != nil {
		rows = append(rows, struct {
			part, from string
			d          spread
		}{"for comparison: Envoy's native local_ratelimit", minus(s2, s1), diff(s2, s1)})
	}
	for _, row := range rows {
		w("| %s | %s | %s |\n", row.part, row.from, fsigned(row.d, 1))
	}
}

func ids(r *report) []string {
	return columns(r, func(s *summary) string { return label(s) })
}

// minus names the difference of two configurations.
func minus(a, b *summary) string { return label(a) + " − " + label(b) }

// numberedRE is a configuration's number as older results wrote it: "(3)".
var numberedRE = regexp.MustCompile(`\(([0-9]{1,2})\)`)

// named replaces the configuration numbers of recorded text (calibration,
// gaps) by the configurations' names.
func named(text string) string {
	return numberedRE.ReplaceAllStringFunc(text, func(m string) string {
		id, err := strconv.Atoi(m[1 : len(m)-1])
		if err != nil {
			return m
		}
		for _, st := range setups {
			if st.ID == id {
				return "*" + st.Label + "*"
			}
		}
		return m
	})
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
		return fmt.Sprintf(": the no-op module calling the host %d times per request (WASI clock_time_get, which the plugin also calls): the difference with the no-op module is what that many calls from a module into Envoy cost", nullHostCalls)
	case s.Name == "plugin-noheaders":
		return `: the plugin's local rule with "headers": "none" (no RateLimit headers on responses)`
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
	r.latRatios()
	return &r, nil
}

// latRatios fills CPULatVs1 and CPULatVs2 where a report written before
// they were lacks them, from the fixed-rate runs it kept, with report's
// references: (1) and (2), or (13) for Envoy on any CPU.
func (r *report) latRatios() {
	ratio := func(s, ref *summary) spread {
		if ref == nil {
			return spread{}
		}
		var xs []float64
		for i := range s.Lat {
			if i >= len(ref.Lat) || s.Lat[i].Samples == 0 || ref.Lat[i].Samples == 0 || ref.Lat[i].CPUPerReqUS == 0 {
				xs = append(xs, math.NaN())
				continue
			}
			xs = append(xs, s.Lat[i].CPUPerReqUS/ref.Lat[i].CPUPerReqUS)
		}
		return spreadOf(xs)
	}
	for _, s := range r.Results {
		setup, _ := setupByID(s.ID)
		ref1, ref2 := r.result(1), r.result(2)
		if setup.Free {
			ref1, ref2 = r.result(13), nil
		}
		if s.CPULatVs1.N == 0 {
			s.CPULatVs1 = ratio(s, ref1)
		}
		if s.CPULatVs2.N == 0 {
			s.CPULatVs2 = ratio(s, ref2)
		}
	}
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
	charts := r.charts()
	if len(r.Results) == 0 {
		charts = nil // nothing to plot
	}
	for name, ch := range charts {
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
		cats = append(cats, plotLabel(s.ID))
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

// holdingSection points to what holding requests costs: measured by make
// bench-delay, which prints its figures (no figures here).
const holdingSection = `## Holding requests

What holding a request until its tokens are there (` + "`" + `max_delay_ms` + "`" + `, [docs/delay.md](../delay.md)) costs is measured apart from this page, on real Envoy with each build, by ` + "`" + `make bench-delay` + "`" + ` ([bench/delay](../../bench/delay/)'s ` + "`" + `TestDelayCost` + "`" + `), which writes its figures to [delay.md](delay.md): how late a held request goes on (p50 and p99, four workers), the plugin's Go heap per held request with 10,000 held on one worker, and an idle Envoy's CPU once nothing is held beside one whose rule never holds (an idle plugin's cost for the timer). The e2e test ` + "`" + `TestDelayManyHeld` + "`" + ` bounds the heap per held request in ` + "`" + `make e2e` + "`" + `.
`
