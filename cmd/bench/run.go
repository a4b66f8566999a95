// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
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
}

// latResult is one open-loop run at a fixed rate.
type latResult struct {
	Rate        float64 `json:"offered_rps"`
	Achieved    float64 `json:"achieved_rps"` // answers per second in the window
	P50US       float64 `json:"p50_us"`
	P90US       float64 `json:"p90_us"`
	P99US       float64 `json:"p99_us"`
	CPUPerReqUS float64 `json:"envoy_cpu_us_per_req"`
	Samples     int     `json:"samples"`
	Late        float64 `json:"late_fraction"`    // of the sends made
	Dropped     float64 `json:"dropped_fraction"` // of the sends scheduled
	Rejected    float64 `json:"rejected_fraction"`
	Errors      int64   `json:"errors"`
	Core0Other  float64 `json:"core0_other_fraction"`
	Core1Other  float64 `json:"core1_other_fraction"`
	Core1Busy   float64 `json:"core1_busy_fraction"` // ours included
}

// probe names what a run watches: Envoy's process and CPU, and the CPU of
// the load generator with the processes of ours that run on it.
type probe struct {
	envoyPID, envoyCPU int
	loadCPU            int
	ours               []int // this process, limitd
}

// snapshot is what is read at the edges of a measuring window.
type snapshot struct {
	at        time.Time
	t         tally
	ticks     int64 // Envoy's
	oursTicks int64
	envoyCore coreTimes
	loadCore  coreTimes
}

func take(pr probe, cs []counts) (snapshot, error) {
	s := snapshot{at: time.Now(), t: sum(cs)}
	var err error
	if s.ticks, err = cpuTicks(pr.envoyPID); err != nil {
		return s, err
	}
	for _, pid := range pr.ours {
		if n, err := cpuTicks(pid); err == nil {
			s.oursTicks += n
		}
	}
	s.envoyCore, _ = readCoreTimes(pr.envoyCPU)
	s.loadCore, _ = readCoreTimes(pr.loadCPU)
	return s, nil
}

// saturate runs the closed loop against addr for warmup + window and
// measures the window.
func saturate(addr string, pr probe, reqs [][]byte, conns int, warmup, window time.Duration) (satResult, error) {
	cs := make([]counts, conns)
	end := time.Now().Add(warmup + window)
	var a, b snapshot
	var err error
	closedLoop(addr, reqs, conns, end, cs, func() {
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
	d := b.t.sub(a.t)
	el := b.at.Sub(a.at).Seconds()
	cpu := float64(b.ticks-a.ticks) / clockTick
	r := satResult{
		Throughput: float64(d.total()) / el,
		EnvoyCPU:   cpu / el,
		CPUSeconds: cpu,
		Requests:   d.total(),
		Errors:     d.errors + d.other,
		Core0Other: otherLoad(a.envoyCore, b.envoyCore, cpu),
		Core1Other: otherLoad(a.loadCore, b.loadCore, float64(b.oursTicks-a.oursTicks)/clockTick),
		Core1Busy:  otherLoad(a.loadCore, b.loadCore, 0),
	}
	if d.total() > 0 {
		r.CPUPerReqUS = cpu / float64(d.total()) * 1e6
		r.Rejected = float64(d.rejected) / float64(d.total())
	}
	return r, nil
}

// fixedRate runs the open loop at rate for warmup + window and measures the
// window.
func fixedRate(addr string, pr probe, reqs [][]byte, conns int, rate float64, warmup, window time.Duration) (latResult, error) {
	cs := make([]counts, conns)
	start := time.Now().Add(50 * time.Millisecond)
	record := start.Add(warmup)
	end := record.Add(window)
	done := make(chan []latencies, 1)
	go func() { done <- openLoop(addr, reqs, conns, rate, start, record, end, cs) }()
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
	var all []int64
	var late, dropped int64
	for _, l := range lats {
		all = append(all, l.ns...)
		late += l.late
		dropped += l.dropped
	}
	slices.Sort(all)
	d := b.t.sub(a.t)
	cpu := float64(b.ticks-a.ticks) / clockTick
	r := latResult{
		Rate:       rate,
		Achieved:   float64(d.total()) / b.at.Sub(a.at).Seconds(),
		P50US:      percentile(all, 0.50) / 1e3,
		P90US:      percentile(all, 0.90) / 1e3,
		P99US:      percentile(all, 0.99) / 1e3,
		Samples:    len(all),
		Errors:     d.errors + d.other,
		Core0Other: otherLoad(a.envoyCore, b.envoyCore, cpu),
		Core1Other: otherLoad(a.loadCore, b.loadCore, float64(b.oursTicks-a.oursTicks)/clockTick),
		Core1Busy:  otherLoad(a.loadCore, b.loadCore, 0),
	}
	if d.total() > 0 {
		r.CPUPerReqUS = cpu / float64(d.total()) * 1e6
		r.Rejected = float64(d.rejected) / float64(d.total())
	}
	if len(all) > 0 {
		r.Late = float64(late) / float64(len(all))
	}
	if n := int64(len(all)) + dropped; n > 0 {
		r.Dropped = float64(dropped) / float64(n)
	}
	return r, nil
}

// percentile is the nearest-rank q-quantile of sorted, in its unit.
func percentile(sorted []int64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	i = max(0, min(i, len(sorted)-1))
	return float64(sorted[i])
}

// coreTimes are one CPU's counters from /proc/stat, in clock ticks.
type coreTimes struct{ busy, total int64 }

func readCoreTimes(cpu int) (coreTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return coreTimes{}, err
	}
	prefix := "cpu" + strconv.Itoa(cpu) + " "
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		var t coreTimes
		for i, f := range strings.Fields(line)[1:] {
			v, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return coreTimes{}, err
			}
			if i >= 8 { // guest and guest_nice are already in user and nice
				break
			}
			t.total += v
			if i != 3 && i != 4 { // idle, iowait
				t.busy += v
			}
		}
		return t, nil
	}
	return coreTimes{}, fmt.Errorf("bench: /proc/stat: no %q line", prefix)
}

// otherLoad is the fraction of a core's time in the window that went to
// processes other than ours (ourCPU seconds, spent on that core since ours
// are pinned to it): how much the shared machine disturbed the run.
func otherLoad(a, b coreTimes, ourCPU float64) float64 {
	total := float64(b.total - a.total)
	if total <= 0 {
		return 0
	}
	busy := float64(b.busy-a.busy) / clockTick
	return max(0, (busy-ourCPU)/(total/clockTick))
}
