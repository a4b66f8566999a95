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

// fsm formats only the median, signed.
func fsm(s spread, prec int) string {
	if s.N == 0 {
		return "–"
	}
	return fmt.Sprintf("%+.*f", prec, s.Median)
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

// leaseCalls writes how often the lease rule called limitd.
func (r *report) leaseCalls(w func(string, ...any)) {
	s := r.result(11)
	if s == nil {
		return
	}
	lease, _ := setupByID(11)
	if n := s.Stats[lease.allowedStat()] + s.Stats[lease.rejectedStat()]; n > 0 {
		w("\nWith leases the plugin called limitd %.2f times per 1,000 requests on one hot key (per request: 1,000).\n",
			1000*float64(s.Stats[leaseCallsStat])/float64(n))
	}
}

// summary is the short text printed at the end of a run.
func (r *report) summary() string {
	var b strings.Builder
	for _, s := range r.Results {
		fmt.Fprintf(&b, "%-36s %8.0f req/s  p50 %6.1f µs  p99 %7.1f µs  CPU %5.1f µs/req  RSS %5.1f MiB\n",
			label(s), s.Throughput.Median, s.P50.Median, s.P99.Median, s.CPUSat.Median, s.RSSMiB.Median)
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
	w("Generated by `make bench` ([bench/cmd/bench](../../bench/cmd/bench)) on %s in %s, load average %s at the start and %s at the end; do not edit by hand ([method](#method)).", in.Date, in.Duration, in.Machine.LoadAvg, in.Machine.LoadEnd)
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
	w(" Also: where the plugin's CPU goes, [attribution.md](attribution.md) and [perf.md](perf.md); ordinary load, [ordinary.md](ordinary.md); holding requests, [delay.md](delay.md); start cost and module size, [footprint.md](../../bench/footprint.md).\n")
	w("\n## What it means for you\n\n")
	w("Envoy with one worker on a core of its own. *÷ none* is Envoy's CPU per request against no filter's: for the same traffic a fleet needs that many times the Envoy CPU, and one core serves 1 ÷ (÷ none) times the requests. *Saturated*: a closed loop of %d connections; *at %.0f req/s*: an open loop on %d connections, half of what no filter serves; *Envoy busy*: CPU per request × rate (near 100%%, queueing dominates latency).\n\n", in.Conns, r.Rate, in.OpenConns)
	w("| configuration | saturated: Envoy CPU µs/req | ÷ none | at %.0f req/s: Envoy CPU µs/req | ÷ none | p50 µs | p99 µs | Envoy busy | Envoy RSS MiB |\n", r.Rate)
	w("|---|---|---|---|---|---|---|---|---|\n")
	var other0, other1, gen float64
	var genAt string
	var missed []string
	var elsewhere bool
	for _, s := range r.Results {
		other0, other1 = max(other0, s.Core0Other.Median), max(other1, s.Core1Other.Median)
		if s.Core1Busy.N > 0 && s.Core1Busy.Median > gen {
			gen, genAt = s.Core1Busy.Median, label(s)
		}
		if s.Late.Median > 0.05 || s.Dropped.Median >= 0.005 {
			missed = append(missed, fmt.Sprintf("*%s* (%s, %s)", label(s), pct(s.Late), pct(s.Dropped)))
		}
		if st, ok := setupByID(s.ID); ok && (st.isDiag() || st.Free) {
			elsewhere = true
			continue
		}
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label(s), f(s.CPUSat, 1), f(s.CPUVs1, 2),
			fm(s.CPULat, 1), fm(s.CPULatVs1, 2), fm(s.P50, 0), fm(s.P99, 0), pct(s.BusyLat), fm(s.RSSMiB, 1))
	}
	r.leaseCalls(w)
	if elsewhere {
		w("\nThe diagnostic and any-CPU configurations are compared in the next sections; their own figures are in results.json and the plots.\n")
	}
	w("\nOther processes and interrupts took at most %.0f%% of Envoy's CPU and %.0f%% of the generator's (medians across rounds); at the fixed rate the generator's CPU was at most %.0f%% busy in all (*%s*; near 100%% the generator adds latency).", 100*other0, 100*other1, 100*gen, genAt)
	if len(missed) > 0 {
		w(" The fixed rate was not met, so the percentiles understate the wait, for (sends late by more than 1 ms, dropped): %s.", strings.Join(missed, ", "))
	}
	if len(in.Starved) > 0 {
		w(" Runs that got no answer at all, left out: %s.", named(strings.Join(in.Starved, "; ")))
	}
	w("\n\n![saturated throughput](throughput.png) ![latency at a fixed rate](latency.png) ![Envoy CPU per request](cpu.png) ![Envoy RSS](rss.png)\n")
	w("\n## The configurations\n\nThe same Envoy binary, listener, route, upstream and `--concurrency 1`; a limit is a bucket per `x-api-key` value, which never empties unless given. Beyond their names:\n\n")
	for _, s := range r.Results {
		if d := describe(s); d != "" {
			w("- *%s*: %s\n", label(s), d)
		}
	}
	for _, g := range in.Gaps {
		w("\n**Gap:** %s\n", named(g))
	}

	r.breakdown(w)
	var plug []*summary
	for _, s := range r.Results {
		if _, ok := s.Stats["wasmcustom.tokenbucket.memory.gc_cycles"]; ok {
			plug = append(plug, s)
		}
	}
	if len(plug) > 0 {
		var perGC, heap []float64
		var retries, errs uint64
		for _, s := range plug {
			if rq, gc := s.Stats["http.ingress.downstream_rq_total"], s.Stats["wasmcustom.tokenbucket.memory.gc_cycles"]; gc > 0 {
				perGC = append(perGC, float64(rq)/float64(gc))
			}
			heap = append(heap, float64(s.Stats["wasmcustom.tokenbucket.memory.heap_bytes"])/1024)
			retries += s.Stats["wasmcustom.tokenbucket.cas_retries"]
			errs += s.Stats["wasmcustom.tokenbucket.service_errors"]
		}
		g, h := spreadOf(perGC), spreadOf(heap)
		w("\nInside the plugin (each plugin Envoy's `/stats` at the end): a guest GC every %.0f to %.0f requests, a guest heap of %.0f to %.0f KiB, %d CAS retries and %d limit-service errors in all; per request counts: [profile.md](../../bench/profile.md).\n", g.Min, g.Max, h.Min, h.Max, retries, errs)
	}

	r.wasmOrNative(w)
	if r.RLS != nil {
		r.RLS.section(w)
	}
	if r.RLQS != nil {
		r.RLQS.section(w)
	}

	w("\n## Method\n\n")
	w("Every page of docs/benchmarks measures this way unless it says otherwise.\n\n")
	w("- Machine: %d CPUs, %s, Linux %s. Envoy %s; plugin %s; generator %s.\n", in.Machine.CPUs, in.Machine.CPUModel, in.Machine.Kernel, in.Envoy, in.Plugin, in.Go)
	w("- Pinning: %s; *any CPU* leaves Envoy free on both.\n", in.Pinning)
	w("- Load: an in-process HTTP/1.1 keep-alive generator on loopback (bench/internal/loadgen), `x-api-key` cycling through %d values, to an in-process upstream. Envoys run side by side, only the one under load busy; each one's `/stats` must show every decision counted and no request failed.\n", in.Keys)
	w("- Rounds: %d, each running every configuration saturated (%s warm-up, %s measured), then at the fixed rate (%s), the order reversed every other round. Figures are medians across rounds, min–max in brackets; ratios (*÷ none*: no filter, for any CPU no filter on any CPU) and differences are taken within each round.\n", in.Rounds, in.Warmup, in.SatWindow, in.LatWindow)
	w("- CPU per request: Envoy's utime + stime (`/proc/<pid>/stat`) ÷ requests, steadier on a shared machine than throughput; for the same traffic a fleet needs (÷ none) times no filter's Envoy CPU. RSS is VmRSS.\n")
	w("- Fixed rate: %.0f%% of no filter's saturated throughput in calibration; latency from writing the request to reading the response. A rejecting configuration's limit rejects half of a closed loop when Envoy gets 85%% of its core; at the fixed rate it gets as many keys as make the rate per key twice the limit.\n", 100*in.Load)
	w("- Raw data, with the calibration: [results.json](results.json).\n")
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
	w("\n## Where the plugin's CPU goes\n\n")
	w("Differences of saturated Envoy CPU per request within each round: each part is the difference of two noisy figures and moves between runs; the total is the steady one. [attribution.md](attribution.md) splits it within one Envoy.\n\n")
	w("| part | µs per request |\n|---|---|\n")
	rows := []struct {
		part, from string
		d          spread
	}{
		{"any Wasm filter: Envoy's Wasm filter and V8", minus(s9, s1), diff(s9, s1)},
		{"the Go plugin idle: Go runtime and SDK, one header read", minus(s7, s9), diff(s7, s9)},
		{"the decision: key hash, shared-data read and CAS write, metric", minus(s8, s7), diff(s8, s7)},
		{"the RateLimit response headers (5 host calls)", minus(s3, s8), diff(s3, s8)},
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
		w("| %s (%s) | %s |\n", row.part, row.from, fsigned(row.d, 1))
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
		return "the plugin's rule behind a condition no request meets (one header read, no decision): a Go Wasm filter's fixed cost"
	case s.Name == "null-wasm":
		return "a hand-made Wasm module exporting the plugin's callbacks, each doing nothing: any Wasm filter's cost"
	case s.Name == "null-wasm-calls":
		return fmt.Sprintf("that module calling the host (WASI clock_time_get) %d times per request", nullHostCalls)
	case s.Name == "plugin-noheaders":
		return `the local rule with "headers": "none"`
	case s.ID == 1:
		return "the router alone"
	case s.Name == "cluster-lease":
		return `a cluster rule with "sync": "lease", one bucket for every request (one hot key)`
	case s.Limit.Rate >= neverLimit || s.Limit.Rate == 0:
		return ""
	default:
		return fmt.Sprintf("%d tokens/s, burst %d; %s rejected saturated, %s at the fixed rate", s.Limit.Rate, s.Limit.Burst, pct(s.Rejected), pct(s.RejectedLat))
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
