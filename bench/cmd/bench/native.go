// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"math"
)

// Issue 25's targets for the native module (rule never rejecting, one
// worker): Envoy CPU per request within these ratios, and its cost over no
// filter within these fractions of the Wasm plugin's.
const (
	targetModuleVsNone      = 1.25
	targetModuleVsNative    = 1.15
	targetOverheadFree      = 0.5
	targetOverheadPinned    = 0.6
	targetStartCPUSeconds   = 0.5
	targetRSSOverNoFilterMB = 20
	// The module's throughput from one worker to four, as a fraction of
	// no filter's: at least this (a lock shared by workers would hold it
	// near 1 ÷ no filter's growth).
	targetScaling = 0.9
)

// perRound is f of the saturated CPU per request of the configurations
// ids, round by round (rounds where one of them got no answer are left
// out), summarised.
func (r *report) perRound(f func(cpu []float64) float64, ids ...int) spread {
	return r.perRoundOf(func(s satResult) float64 { return s.CPUPerReqUS }, f, ids...)
}

// perRoundOf is perRound of another figure v of the saturation runs.
func (r *report) perRoundOf(v func(satResult) float64, f func([]float64) float64, ids ...int) spread {
	var ss []*summary
	for _, id := range ids {
		s := r.result(id)
		if s == nil {
			return spread{}
		}
		ss = append(ss, s)
	}
	var xs []float64
	for i := range ss[0].Sat {
		cpu := make([]float64, len(ss))
		ok := true
		for j, s := range ss {
			if i >= len(s.Sat) || s.Sat[i].Requests == 0 {
				ok = false
				break
			}
			cpu[j] = v(s.Sat[i])
		}
		if ok {
			xs = append(xs, f(cpu))
		}
	}
	return spreadOf(xs)
}

// overhead is (module − none) ÷ (plugin − none) of one round's CPU per
// request: the native module's cost over no filter as a fraction of the
// Wasm plugin's.
func overhead(c []float64) float64 {
	if c[2] <= c[0] {
		return math.NaN()
	}
	return (c[1] - c[0]) / (c[2] - c[0])
}

// atLeast is verdict for a target of at least min.
func atLeast(v spread, min float64) string {
	switch {
	case v.N == 0:
		return "not measured"
	case v.Median >= min:
		return "met"
	default:
		return "**not met**"
	}
}

func ratio(c []float64) float64 { return c[0] / c[1] }

// verdict says whether the median v meets a target of at most max.
func verdict(v spread, max float64) string {
	switch {
	case v.N == 0:
		return "not measured"
	case v.Median <= max:
		return "met"
	default:
		return "**not met**"
	}
}

// wasmOrNative is the page's section on the native module against its
// targets: CPU per request against no filter and local_ratelimit, its
// overhead as a fraction of the plugin's with Envoy pinned to one CPU and
// free on every CPU, and the starts.
func (r *report) wasmOrNative(w func(string, ...any)) {
	if r.result(12) == nil && r.result(15) == nil && len(r.Startups) == 0 {
		return
	}
	w("\n## Wasm or native\n\n")
	w("The local rule in the same engine built as an Envoy dynamic module (docs/native.md), against its targets: Envoy CPU per request; *pinned*, Envoy and so the module's Go runtime on one CPU (a container limited to one CPU); *any CPU*, free on both; *cost*, CPU per request over no filter's; throughput saturated, any CPU.\n\n")
	w("| figure | measured | target | |\n|---|---|---|---|\n")
	row := func(name string, v spread, max float64) {
		w("| %s | %s | ≤ %.2f | %s |\n", name, f(v, 2), max, verdict(v, max))
	}
	row("module ÷ no filter, pinned", r.perRound(ratio, 12, 1), targetModuleVsNone)
	row("module ÷ local_ratelimit, pinned", r.perRound(ratio, 12, 2), targetModuleVsNative)
	row("module's cost ÷ the plugin's, pinned", r.perRound(overhead, 1, 12, 3), targetOverheadPinned)
	row("module's cost ÷ the plugin's, any CPU", r.perRound(overhead, 13, 15, 14), targetOverheadFree)
	thr := func(s satResult) float64 { return s.Throughput }
	none4, mod4 := r.perRoundOf(thr, ratio, 16, 13), r.perRoundOf(thr, ratio, 17, 15)
	scale := r.perRoundOf(thr, func(t []float64) float64 { return (t[0] / t[1]) / (t[2] / t[3]) }, 17, 15, 16, 13)
	w("| throughput, 4 workers ÷ 1: no filter | %s | | |\n", f(none4, 2))
	w("| throughput, 4 workers ÷ 1: module | %s | | |\n", f(mod4, 2))
	w("| module's growth ÷ no filter's | %s | ≥ %.2f | %s |\n", f(scale, 2), targetScaling, atLeast(scale, targetScaling))
	if len(r.Startups) == 0 {
		return
	}
	var none *startup
	for i := range r.Startups {
		if r.Startups[i].Name == "no filter" {
			none = &r.Startups[i]
		}
	}
	w("\nEnvoy started %d times with each (one worker, any CPU): CPU (all threads) and wall time until the first 200, RSS after %d more requests (the module's targets: at most %.1f s of CPU, no filter + %d MiB).\n\n", max(r.Startups[0].CPU.N, 1), startRequests, targetStartCPUSeconds, targetRSSOverNoFilterMB)
	w("| configuration | CPU s to the first 200 | wall s | RSS MiB | RSS − no filter MiB |\n|---|---|---|---|---|\n")
	for _, s := range r.Startups {
		more := "–"
		if none != nil && s.Name != none.Name {
			more = fmt.Sprintf("%+.1f", s.RSSMiB.Median-none.RSSMiB.Median)
		}
		w("| %s | %s | %s | %s | %s |\n", s.Name, f(s.CPU, 2), f(s.Wall, 2), f(s.RSSMiB, 1), more)
	}
}
