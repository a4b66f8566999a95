// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestEdgeTimes: the bursts fall 250 ms before and 50 ms after the next
// whole second that is at least 600 ms away.
func TestEdgeTimes(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 7, 0, 0, 0, time.UTC)
	for _, c := range []struct{ now, edge time.Duration }{
		{0, time.Second},
		{400 * time.Millisecond, time.Second},
		{401 * time.Millisecond, 2 * time.Second},
		{999 * time.Millisecond, 2 * time.Second},
	} {
		edge, before, after := edgeTimes(t0.Add(c.now))
		if want := t0.Add(c.edge); !edge.Equal(want) {
			t.Errorf("now +%v: edge +%v, want +%v", c.now, edge.Sub(t0), c.edge)
		}
		if edge.Sub(before) != 250*time.Millisecond || after.Sub(edge) != 50*time.Millisecond {
			t.Errorf("now +%v: bursts at edge %v and %v", c.now, before.Sub(edge), after.Sub(edge))
		}
	}
}

// TestEdgeBound: a token bucket of 20 refilled at 20/s admits at most 20 +
// 20 × span.
func TestEdgeBound(t *testing.T) {
	for _, c := range []struct {
		spanMS float64
		want   int
	}{{0, 20}, {300, 26}, {349, 26}, {1000, 40}} {
		if got := (edgeTrial{SpanMS: c.spanMS}).Bound(); got != c.want {
			t.Errorf("span %v ms: bound %d, want %d", c.spanMS, got, c.want)
		}
	}
}

// rlsFixture is a report of two rounds with every configuration of the
// section but the plugin's.
func rlsFixture(limitdCPU, limitdP99 float64, tokenAdmitted int) *rlsReport {
	run := func(svc, redis, p99 float64) ([]satResult, []latResult) {
		var sat []satResult
		var lat []latResult
		for range 2 {
			sat = append(sat, satResult{Requests: 1000, Throughput: 1000, Watched: []float64{svc * 1000 / 1e6, redis * 1000 / 1e6},
				Preempted: []float64{svc * 10, 0}})
			lat = append(lat, latResult{Samples: 100, P50US: p99 / 2, P99US: p99, Watched: []float64{svc * 100 / 1e6, redis * 100 / 1e6}})
		}
		return sat, lat
	}
	r := &rlsReport{EdgeLimit: rlsEdgeLimit, Rounds: 2}
	add := func(id int, svc, redis, p99 float64, edges []edgeTrial) {
		c := rlsConfigs[0]
		for _, x := range append(slices.Clip(rlsConfigs), rlsFloorConfig, rlsBeforeConfig) {
			if x.ID == id {
				c = x
			}
		}
		s := &rlsSummary{rlsConfig: c, Edges: edges}
		s.Sat, s.Lat = run(svc, redis, p99)
		r.Results = append(r.Results, s)
	}
	fixed := []edgeTrial{{Before: 20, After: 20, SpanMS: 320, Clean: true, Attempts: 1}}
	add(40, 0, 0, 500, nil)
	add(41, 100, 20, 1000, fixed)
	add(42, limitdCPU, 0, limitdP99, fixed)
	add(43, limitdCPU, 0, limitdP99, []edgeTrial{{Before: 20, After: tokenAdmitted - 20, SpanMS: 320, Clean: true, Attempts: 2}})
	add(rlsMemoryID, limitdCPU*0.75, 0, limitdP99, nil)
	add(rlsFloorConfig.ID, limitdCPU*0.9, 0, limitdP99, nil)
	return r
}

// TestRLSSectionVerdicts: the targets' rows say met or not met from the
// per-round ratios, and the edge rows from the trials.
func TestRLSSectionVerdicts(t *testing.T) {
	page := func(r *rlsReport) string {
		var b strings.Builder
		r.section(func(format string, args ...any) {
			b.WriteString(strings.TrimSpace(fmt.Sprintf(format, args...)) + "\n")
		})
		return b.String()
	}
	good := page(rlsFixture(60, 900, 26))
	for _, want := range []string{
		"| ratelimit filter → limitd, token buckets ÷ peer, saturated | 0.50 | ≤ 0.50 | met |",
		"| ratelimit filter → limitd, token buckets ÷ peer, fixed rate | 0.50 | ≤ 0.50 | met |",
		"| service + Redis µs/req | at the fixed rate: service + Redis µs/req | p99 µs |",
		"| 120.0 | 120.0 | 1000 |",
		"| 60.0 | 60.0 | 900 |",
		"| ratelimit filter → limitd, token buckets − peer, p99 µs | -100 | ≤ 0 | met |",
		"| ratelimit filter → limitd, token buckets: admitted across a window edge, the trial nearest its bound | 26 (bound 26) | ≤ the bound | met |",
		"| ratelimit filter → limitd, fixed_window: admitted across a window edge | 40 | as the peer: 40 | met |",
		"| the door's floor: limitd in memory ÷ peer, saturated | 0.37 | ≤ 0.50 | below: the target is reachable by the store's cost |",
		"| a script's floor: read, clock, write ÷ peer, saturated | 0.45 | ≤ 0.50 | below: the target is reachable by the script's arithmetic |",
		"per decision, saturated (the service's `nonvoluntary_ctxt_switches`): the peer 1.00, token buckets 0.60, a script's floor 0.54, in memory 0.45.",
	} {
		if !strings.Contains(good, want) {
			t.Errorf("page lacks %q:\n%s", want, good)
		}
	}
	bad := page(rlsFixture(120, 1100, 30))
	for _, want := range []string{
		"÷ peer, saturated | 1.00 | ≤ 0.50 | **not met** |",
		"÷ peer, fixed rate | 1.00 | ≤ 0.50 | **not met** |",
		"p99 µs | 100 | ≤ 0 | **not met** |",
		"| 30 (bound 26) | ≤ the bound | **not met** |",
		"| the door's floor: limitd in memory ÷ peer, fixed rate | 0.75 | ≤ 0.50 | **above: out of reach of any store under this door** |",
		"| a script's floor: read, clock, write ÷ peer, saturated | 0.90 | ≤ 0.50 | **above: out of reach of one script call per decision** |",
	} {
		if !strings.Contains(bad, want) {
			t.Errorf("page lacks %q:\n%s", want, bad)
		}
	}
}

// TestRLSOnlyPage: a report holding only the RLS section renders that
// section, without the rounds' tables.
func TestRLSOnlyPage(t *testing.T) {
	md := (&report{RLS: rlsFixture(60, 900, 26)}).markdown()
	if !strings.Contains(md, "## Envoy's ratelimit filter") || strings.Contains(md, "## Envoy CPU, throughput and latency") {
		t.Errorf("page:\n%s", md)
	}
}

// TestGoPackage names the package of Go symbols and leaves others alone.
func TestGoPackage(t *testing.T) {
	for sym, want := range map[string]string{
		"runtime.step": "runtime",
		"google.golang.org/grpc/internal/transport.(*loopyWriter).run": "google.golang.org/grpc/internal/transport",
		"github.com/redis/go-redis/v9.(*baseClient).process":           "github.com/redis/go-redis/v9",
		"sync/atomic.(*Int64).Add":                                     "sync/atomic",
		"luaV_execute":                                                 "luaV_execute",
		"finish_task_switch.isra.0":                                    "finish_task_switch",
	} {
		if got := goPackage(sym); got != want {
			t.Errorf("goPackage(%q) = %q, want %q", sym, got, want)
		}
	}
}

// TestPerfGroups sums perf's lines by package, the kernel's apart, or
// keeps them by function.
func TestPerfGroups(t *testing.T) {
	report := []byte("# Samples: 2K of event 'cpu-clock'\n#\n" +
		"     5.00%  [k] finish_task_switch.isra.0\n" +
		"     4.00%  [.] runtime.step\n" +
		"     3.00%  [.] runtime.mallocgc\n" +
		"     2.00%  [.] google.golang.org/grpc/internal/transport.(*loopyWriter).run\n" +
		"     1.00%  [k] _raw_spin_unlock_irqrestore\n")
	got, samples, err := perfGroups(report, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []profileEntry{{"runtime", 0.07}, {"kernel", 0.06}, {"google.golang.org/grpc/internal/transport", 0.02}}
	if samples != 2000 || len(got) != len(want) {
		t.Fatalf("got %v (%d samples), want %v (2000)", got, samples, want)
	}
	for i := range want {
		if got[i].Function != want[i].Function || got[i].Share < want[i].Share-1e-9 || got[i].Share > want[i].Share+1e-9 {
			t.Errorf("group %d: %v, want %v", i, got[i], want[i])
		}
	}
	byFunc, _, err := perfGroups(report, true)
	if err != nil || len(byFunc) != 5 || byFunc[0].Function != "finish_task_switch.isra.0" {
		t.Errorf("by function: %v, %v", byFunc, err)
	}
}

// perPipeline reads the growth of limitd_redis_batch_size's sum and count
// as decisions a pipeline, and says nothing without both runs' counters or
// with no pipeline in one of them.
func TestPerPipeline(t *testing.T) {
	for _, tt := range []struct {
		sat, lat []float64
		want     string
	}{
		{[]float64{300, 100}, []float64{50, 50}, " | decisions a pipeline: saturated 3.00, fixed rate 1.00"},
		{nil, []float64{50, 50}, ""},
		{[]float64{300, 100}, []float64{0, 0}, ""},
	} {
		if got := perPipeline(tt.sat, tt.lat); got != tt.want {
			t.Errorf("perPipeline(%v, %v) = %q, want %q", tt.sat, tt.lat, got, tt.want)
		}
	}
}

// TestPreemptions reads this process's preemptions: a count, and one that
// does not fall.
func TestPreemptions(t *testing.T) {
	a, err := preemptions(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	b, err := preemptions(os.Getpid())
	if err != nil || a < 0 || b < a {
		t.Fatalf("preemptions %v then %v (%v)", a, b, err)
	}
	if _, err := preemptions(-1); err == nil {
		t.Error("no error for a process that does not exist")
	}
}
