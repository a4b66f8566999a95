// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bench/internal/loadgen"
)

// satResult is one closed-loop saturation run.
type satResult struct {
	Throughput  float64 `json:"throughput_rps"`
	CPUPerReqUS float64 `json:"envoy_cpu_us_per_req"`
	EnvoyCPU    float64 `json:"envoy_cpu_fraction"` // of one core
	CPUSeconds  float64 `json:"envoy_cpu_seconds"`
	Requests    int64   `json:"requests"`
	Rejected    float64 `json:"rejected_fraction"`
	Errors      int64   `json:"errors"` // transport errors and statuses other than 200 and 429
	Core0Other  float64 `json:"core0_other_fraction"`
	Core1Other  float64 `json:"core1_other_fraction"`
	Core1Busy   float64 `json:"core1_busy_fraction"` // ours included
	// Watched are the CPU seconds of the probe's watched processes over
	// the window, in their order (the RLS section: the service and Redis).
	Watched []float64 `json:"watched_cpu_seconds,omitempty"`
	// Preempted are the watched processes' preemptions over the window
	// (preemptions), in the same order.
	Preempted []float64 `json:"watched_preempted,omitempty"`
	// Counters are how much the probe's counters grew over the window, in
	// their order (the RLQS section: limitd's stream messages, the plugin's
	// lease calls).
	Counters []float64 `json:"counters,omitempty"`
}

// latResult is one open-loop run at a fixed rate.
type latResult struct {
	Rate        float64   `json:"offered_rps"`
	Achieved    float64   `json:"achieved_rps"` // answers per second in the window
	P50US       float64   `json:"p50_us"`
	P90US       float64   `json:"p90_us"`
	P99US       float64   `json:"p99_us"`
	CPUPerReqUS float64   `json:"envoy_cpu_us_per_req"`
	Samples     int       `json:"samples"`
	Late        float64   `json:"late_fraction"`    // of the sends made
	Dropped     float64   `json:"dropped_fraction"` // of the sends scheduled
	Rejected    float64   `json:"rejected_fraction"`
	Errors      int64     `json:"errors"`
	Core0Other  float64   `json:"core0_other_fraction"`
	Core1Other  float64   `json:"core1_other_fraction"`
	Core1Busy   float64   `json:"core1_busy_fraction"` // ours included
	Watched     []float64 `json:"watched_cpu_seconds,omitempty"`
	Counters    []float64 `json:"counters,omitempty"`
}

// probe names what a run watches: Envoy's process and CPU, and the CPU of
// the load generator with the processes of ours that run on it.
type probe struct {
	envoyPID, envoyCPU int
	loadCPU            int
	ours               []int // this process, limitd
	// watch are processes whose CPU seconds over the window each run
	// reports apart (satResult.Watched).
	watch []int
	// counters, when set, reads counters (limitd's /metrics, Envoy's
	// /stats) at the window's edges; each run reports their growth
	// (satResult.Counters).
	counters func() ([]float64, error)
}

// snapshot is what is read at the edges of a measuring window.
type snapshot struct {
	at        time.Time
	t         loadgen.Tally
	cpu       float64 // Envoy's CPU seconds
	oursCPU   float64
	envoyCore coreTimes
	loadCore  coreTimes
	watched   []float64
	preempted []float64
	counters  []float64
}

func take(pr probe, cs []loadgen.Counts) (snapshot, error) {
	s := snapshot{at: time.Now(), t: loadgen.Sum(cs)}
	var err error
	if s.cpu, err = cpuSeconds(pr.envoyPID); err != nil {
		return s, err
	}
	for _, pid := range pr.ours {
		if c, err := cpuSeconds(pid); err == nil {
			s.oursCPU += c
		}
	}
	for _, pid := range pr.watch {
		c, err := cpuSeconds(pid)
		if err != nil {
			return s, err
		}
		s.watched = append(s.watched, c)
		n, err := preemptions(pid)
		if err != nil {
			return s, err
		}
		s.preempted = append(s.preempted, n)
	}
	if pr.counters != nil {
		if s.counters, err = pr.counters(); err != nil {
			return s, err
		}
	}
	s.envoyCore, _ = readCoreTimes(pr.envoyCPU)
	s.loadCore, _ = readCoreTimes(pr.loadCPU)
	return s, nil
}

// saturate runs the closed loop against addr for warmup + window and
// measures the window.
func saturate(addr string, pr probe, reqs [][]byte, conns int, warmup, window time.Duration) (satResult, error) {
	cs := make([]loadgen.Counts, conns)
	end := time.Now().Add(warmup + window)
	var a, b snapshot
	var err error
	do, closeConns := loadgen.HTTP(addr, conns, end, loadgen.Cycle(reqs, conns))
	defer closeConns()
	loadgen.Closed(do, cs, time.Time{}, end, func() {
		time.Sleep(warmup)
		if a, err = take(pr, cs); err != nil {
			return
		}
		time.Sleep(window)
		b, err = take(pr, cs)
	})
	if err != nil {
		return satResult{}, err
	}
	d := b.t.Sub(a.t)
	el := b.at.Sub(a.at).Seconds()
	cpu := b.cpu - a.cpu
	r := satResult{
		Throughput: float64(d.Total()) / el,
		EnvoyCPU:   cpu / el,
		CPUSeconds: cpu,
		Requests:   d.Total(),
		Errors:     d.Errors + d.Other,
		Core0Other: otherLoad(a.envoyCore, b.envoyCore, cpu),
		Core1Other: otherLoad(a.loadCore, b.loadCore, b.oursCPU-a.oursCPU),
		Core1Busy:  otherLoad(a.loadCore, b.loadCore, 0),
		Watched:    watchedDiff(a, b),
		Preempted:  diff(a.preempted, b.preempted),
		Counters:   diff(a.counters, b.counters),
	}
	if d.Total() > 0 {
		r.CPUPerReqUS = cpu / float64(d.Total()) * 1e6
		r.Rejected = float64(d.Rejected) / float64(d.Total())
	}
	return r, nil
}

// fixedRate runs the open loop at rate for warmup + window and measures the
// window.
func fixedRate(addr string, pr probe, reqs [][]byte, conns int, rate float64, warmup, window time.Duration) (latResult, error) {
	cs := make([]loadgen.Counts, conns)
	start := time.Now().Add(50 * time.Millisecond)
	record := start.Add(warmup)
	end := record.Add(window)
	do, closeConns := loadgen.HTTP(addr, conns, end, loadgen.Cycle(reqs, conns))
	defer closeConns()
	done := make(chan []loadgen.Latencies, 1)
	go func() { done <- loadgen.Open(do, cs, rate, start, record, end) }()
	time.Sleep(time.Until(record))
	a, err := take(pr, cs)
	if err != nil {
		<-done
		return latResult{}, err
	}
	time.Sleep(time.Until(end))
	b, err := take(pr, cs)
	lats := <-done
	if err != nil {
		return latResult{}, err
	}
	m := loadgen.Merge(lats)
	all, late, dropped := m.NS, m.Late, m.Dropped
	d := b.t.Sub(a.t)
	cpu := b.cpu - a.cpu
	r := latResult{
		Rate:       rate,
		Achieved:   float64(d.Total()) / b.at.Sub(a.at).Seconds(),
		P50US:      loadgen.Percentile(all, 0.50) / 1e3,
		P90US:      loadgen.Percentile(all, 0.90) / 1e3,
		P99US:      loadgen.Percentile(all, 0.99) / 1e3,
		Samples:    len(all),
		Errors:     d.Errors + d.Other,
		Core0Other: otherLoad(a.envoyCore, b.envoyCore, cpu),
		Core1Other: otherLoad(a.loadCore, b.loadCore, b.oursCPU-a.oursCPU),
		Core1Busy:  otherLoad(a.loadCore, b.loadCore, 0),
		Watched:    watchedDiff(a, b),
		Counters:   diff(a.counters, b.counters),
	}
	if d.Total() > 0 {
		r.CPUPerReqUS = cpu / float64(d.Total()) * 1e6
		r.Rejected = float64(d.Rejected) / float64(d.Total())
	}
	if len(all) > 0 {
		r.Late = float64(late) / float64(len(all))
	}
	if n := int64(len(all)) + dropped; n > 0 {
		r.Dropped = float64(dropped) / float64(n)
	}
	return r, nil
}

// watchedDiff is the CPU seconds each watched process used between a and b.
func watchedDiff(a, b snapshot) []float64 { return diff(a.watched, b.watched) }

// diff is b − a, element by element (nil when their lengths differ).
func diff(a, b []float64) []float64 {
	if len(a) != len(b) {
		return nil
	}
	var d []float64
	for i := range a {
		d = append(d, b[i]-a[i])
	}
	return d
}
