// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"path/filepath"
	"strings"
)

// attribOps is how many operations per request an attribution setup makes:
// enough that their cost stands out of the run-to-run noise (±10 µs here).
// Adding response headers makes 50: the load generator reads at most 100
// header lines.
const attribOps = 100

// attribN is the operations per request of each attribution setup, by ID.
var attribN = map[int]int{}

// attribSetups isolate each kind of work the plugin makes per request, for
// `make bench-attrib`: the Go floor (internal/footprint/ops doing nothing:
// the SDK, our glue and the Go runtime's entry into each callback) and the
// same module making attribOps of one host operation per request. They run
// with (1) no filter and (9) the no-op module written in WebAssembly text.
var attribSetups = []setup{
	opsSetup(11, "none", "Go floor (SDK and glue, callbacks do nothing)"),
	opsSetup(12, "get_shared_data", "proxy_get_shared_data (a 32-byte value)"),
	opsSetup(13, "set_shared_data", "proxy_set_shared_data"),
	opsSetup(14, "increment_metric", "proxy_increment_metric"),
	opsSetup(15, "get_header", "proxy_get_header_map_value (a present header)"),
	opsSetupN(16, "add_header", "proxy_add_header_map_value (response)", 50),
	opsSetup(17, "time_now", "time.Now (two WASI clock_time_get)"),
	opsSetup(18, "host_time", "proxy_get_current_time_nanoseconds"),
	opsSetupN(19, "reject", "every 2nd request rejected (429 sent by the module)", 2),
}

// attribRejectID is the setup that rejects one request in two: not an
// operation per request, but the Go floor of a limiter rejecting half its
// requests, for issue 11's rejecting target.
const attribRejectID = 19

// attribTwinNull and attribTwinPlugin are a second Envoy running (9) and
// (3): the same configuration in another process, whose difference from the
// first is the spread every other difference here carries.
const (
	attribTwinNull   = 20
	attribTwinPlugin = 21
)

// splitSetup is the plugin with two rules that apply only when a request
// says so: a shadow rule (its bucket, no response headers) on x-bench-shadow
// and an enforced rule (its bucket and the five RateLimit headers) on
// x-bench-enforce. splitSets are the request sets each round sends to the
// same Envoy, so that their differences carry no process-to-process spread.
var splitSetup = setup{ID: 22, Name: "plugin-split", Label: "plugin, rules chosen by request header", Plot: "split", Kind: kindPlugin,
	Plugin: func(l limit) string {
		when := func(mode, hdr string) string {
			return `"mode":"` + mode + `","match":{"header:` + hdr + `":{"present":true}},`
		}
		return `{"rules":[` + keyRule("shadow", when("shadow", "x-bench-shadow"), l) + `,` + keyRule("per-key", when("enforce", "x-bench-enforce"), l) + `]}`
	}}

var splitSets = []struct{ name, header string }{
	{"no rule applies", "x-bench-none: 1"},
	{"the shadow rule decides (no response headers)", "x-bench-shadow: 1"},
	{"the enforced rule decides and adds its headers", "x-bench-enforce: 1"},
}

// twin is s in a second Envoy, as configuration id.
func twin(s setup, id int) setup {
	s.ID, s.Label = id, s.Label+", a second Envoy"
	return s
}

func opsSetup(id int, op, label string) setup {
	if op == "none" {
		return opsSetupN(id, op, label, 0)
	}
	return opsSetupN(id, op, label, attribOps)
}

func opsSetupN(id int, op, label string, n int) setup {
	attribN[id] = n
	cfg := fmt.Sprintf("%s %d", op, n)
	return setup{ID: id, Name: "ops-" + op, Label: label, Plot: op, Kind: kindPlugin,
		Plugin: func(limit) string { return cfg }}
}

// isOps reports whether s runs internal/footprint/ops.
func (s setup) isOps() bool { return strings.HasPrefix(s.Name, "ops-") }

// attribRun measures every target's Envoy CPU per request with -rounds
// interleaved saturation runs, and writes attribution.md into -out: what
// each layer and each host operation costs, from the differences of
// medians.
func (b *bench) attribRun() error {
	p := b.p
	cpu, thr, rel := map[int][]float64{}, map[int][]float64{}, map[int][]float64{}
	split := make([][]float64, len(splitSets))
	for r := range p.rounds {
		round := map[int]float64{}
		for _, t := range b.roundOrder(r) {
			if t.s.ID == splitSetup.ID {
				for i, set := range splitSets {
					s, err := saturate(b.addr(t), b.probe(t), keyRequests(p.keys, set.header), p.conns, p.warmup, p.satWindow)
					if err != nil {
						return fmt.Errorf("bench: round %d, (%d) %s: %w", r+1, t.s.ID, set.name, err)
					}
					split[i] = append(split[i], s.CPUPerReqUS)
					b.logf("round %d (%d) %-50s %7.0f req/s %6.1f µs CPU/req", r+1, t.s.ID, set.name, s.Throughput, s.CPUPerReqUS)
				}
				continue
			}
			s, err := saturate(b.addr(t), b.probe(t), b.reqs, p.conns, p.warmup, p.satWindow)
			if err != nil {
				return fmt.Errorf("bench: round %d, (%d) %s: %w", r+1, t.s.ID, t.s.Label, err)
			}
			if s.Errors > 0 || s.Requests == 0 {
				return fmt.Errorf("bench: round %d, (%d) %s: %d errors in %d requests", r+1, t.s.ID, t.s.Label, s.Errors, s.Requests)
			}
			cpu[t.s.ID] = append(cpu[t.s.ID], s.CPUPerReqUS)
			thr[t.s.ID] = append(thr[t.s.ID], s.Throughput)
			round[t.s.ID] = s.Throughput
			b.logf("round %d (%d) %-50s %7.0f req/s %6.1f µs CPU/req", r+1, t.s.ID, t.s.Label, s.Throughput, s.CPUPerReqUS)
		}
		if base := round[1]; base > 0 {
			for id, x := range round {
				rel[id] = append(rel[id], x/base)
			}
		}
	}
	// tp is a configuration's saturated throughput and its ratio to (1)
	// within each round.
	tp := func(id int) string {
		if len(thr[id]) == 0 || len(rel[id]) == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f | %.3f (%.3f–%.3f)", spreadOf(thr[id]).Median, spreadOf(rel[id]).Median, spreadOf(rel[id]).Min, spreadOf(rel[id]).Max)
	}
	med := func(id int) (spread, bool) {
		xs, ok := cpu[id]
		if !ok {
			return spread{}, false
		}
		return spreadOf(xs), true
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# Where the plugin's microseconds go: a cost per operation\n\n"+
		"Generated by `make bench-attrib` (`bench -attrib`): the same Envoy 1.40 (`--concurrency 1`, one listener, the same "+
		"upstream) with (1) no filter, (9) a no-op module written in WebAssembly text, and `internal/footprint/ops`: the Go "+
		"floor (the SDK and our glue, callbacks that do nothing) and the same module making %d of one host operation per "+
		"request (%d adding response headers). Envoy CPU per request (utime + stime over a %v closed loop of %d connections) is the median of %d "+
		"interleaved rounds, min–max in brackets; an operation's cost is (that row − the Go floor) / n. Throughput is "+
		"the saturated req/s and its ratio to (1) within each round (medians): with Envoy's one worker saturated it "+
		"follows the CPU per request. Load average at the start: %s; at the end: %s.\n\n", attribOps, attribN[16], p.satWindow, p.conns, p.rounds, b.info.Machine.LoadAvg, loadAvg())
	fmt.Fprintln(&md, "| configuration | Envoy CPU µs/req | − previous layer | per operation | req/s | ÷ (1) |")
	fmt.Fprintln(&md, "|---|---:|---:|---:|---:|---:|")
	none, _ := med(1)
	null, okNull := med(9)
	floor, okFloor := med(11)
	fmt.Fprintf(&md, "| (1) no filter | %s | | | %s |\n", f(none, 1), tp(1))
	if okNull {
		fmt.Fprintf(&md, "| (9) no-op module (WebAssembly text): the Wasm filter itself | %s | %+.1f over (1) | | %s |\n", f(null, 1), null.Median-none.Median, tp(9))
	}
	if okFloor {
		base := none
		if okNull {
			base = null
		}
		fmt.Fprintf(&md, "| (11) Go floor: the Go runtime and SDK on each callback | %s | %+.1f over (9) | | %s |\n", f(floor, 1), floor.Median-base.Median, tp(11))
	}
	for _, s := range attribSetups[1:] {
		m, ok := med(s.ID)
		if !ok || !okFloor {
			continue
		}
		d, n := m.Median-floor.Median, attribN[s.ID]
		if s.ID == attribRejectID {
			fmt.Fprintf(&md, "| (%d) Go floor, %s | %s | %+.1f over (11) | | %s |\n", s.ID, s.Label, f(m, 1), d, tp(s.ID))
			continue
		}
		fmt.Fprintf(&md, "| (%d) %d × %s | %s | %+.1f over (11) | **%.2f µs** | %s |\n", s.ID, n, s.Label, f(m, 1), d, d/float64(n), tp(s.ID))
	}
	// The plugin's allowed request makes these operations (make
	// bench-profile): the sum over the floor is what they alone cost.
	path := []struct {
		id, n int
	}{{15, 1}, {12, 1}, {13, 1}, {14, 1}, {16, 5}, {18, 1}}
	predicted, okPath := floor.Median, okFloor
	for _, op := range path {
		m, ok := med(op.id)
		okPath = okPath && ok
		predicted += (m.Median - floor.Median) / float64(attribN[op.id]) * float64(op.n)
	}
	plug, okPlug := med(3)
	if okFloor {
		fmt.Fprintf(&md, "\n## The plugin against its parts\n\n"+
			"The plugin's configurations of `make bench` in the same rounds. An allowed request of (3) makes 1 request-header "+
			"read, 1 shared-data read and 1 write, 1 counter increment, 5 response headers and 1 clock read "+
			"([profile.md](profile.md)); their costs above, added to the Go floor, are what the plugin would cost if its "+
			"own code were free.\n\n")
		fmt.Fprintln(&md, "| configuration | Envoy CPU µs/req | over (11) | over (9) | req/s | ÷ (1) |")
		fmt.Fprintln(&md, "|---|---:|---:|---:|---:|---:|")
		for _, id := range []int{7, 8, 3} {
			m, ok := med(id)
			if !ok {
				continue
			}
			fmt.Fprintf(&md, "| (%d) %s | %s | %+.1f | %+.1f | %s |\n", id, setups[id-1].Label, f(m, 1), m.Median-floor.Median, m.Median-null.Median, tp(id))
		}
		if m, ok := med(attribTwinPlugin); ok {
			fmt.Fprintf(&md, "| (%d) plugin, a second Envoy | %s | %+.1f | %+.1f | %s |\n", attribTwinPlugin, f(m, 1), m.Median-floor.Median, m.Median-null.Median, tp(attribTwinPlugin))
		}
		if okPath && okPlug {
			fmt.Fprintf(&md, "| the Go floor + (3)'s host operations | %.1f | %+.1f | %+.1f | | |\n", predicted, predicted-floor.Median, predicted-null.Median)
			fmt.Fprintf(&md, "\nSo of (3) − (9) = %+.1f µs, %+.1f is the Go floor, %+.1f the host operations the request path makes, "+
				"and %+.1f the rest: the plugin's own code as it runs inside Envoy, and host work the operations' loops do not "+
				"capture ([footprint.md](footprint.md) splits it further with perf and with the guest alone under V8).\n",
				plug.Median-null.Median, floor.Median-null.Median, predicted-floor.Median, plug.Median-predicted)
		}
	}
	if len(split[0]) > 0 {
		fmt.Fprintf(&md, "\n## Within one Envoy\n\n"+
			"(%d) is the plugin with two rules that apply only when a request carries their header: a shadow rule (its "+
			"bucket, no response headers) and an enforced one (its bucket and the five RateLimit headers). Each round sends "+
			"three request sets to that same Envoy, so their differences carry no spread between processes. An allowed "+
			"decision makes 1 request-header read, 1 shared-data read and 1 write, 1 counter increment and 1 clock read; the "+
			"enforced rule adds 5 response headers.\n\n", splitSetup.ID)
		fmt.Fprintln(&md, "| requests | Envoy CPU µs/req | − the row above |")
		fmt.Fprintln(&md, "|---|---:|---:|")
		for i, set := range splitSets {
			m := spreadOf(split[i])
			d := ""
			if i > 0 {
				// the difference within each round, then its median
				ds := make([]float64, len(split[i]))
				for k := range ds {
					ds[k] = split[i][k] - split[i-1][k]
				}
				dm := spreadOf(ds)
				d = fmt.Sprintf("%+.1f (%+.1f…%+.1f)", dm.Median, dm.Min, dm.Max)
			}
			fmt.Fprintf(&md, "| %s | %s | %s |\n", set.name, f(m, 1), d)
		}
	}
	spreadNull, okSpread := med(attribTwinNull)
	if okSpread && okNull {
		twinPlug, _ := med(attribTwinPlugin)
		fmt.Fprintf(&md, "\n## How far apart two Envoys measure\n\n"+
			"(%d) and (%d) run (9) and (3) again, each in a second Envoy, in the same rounds: the no-op module measured %s "+
			"against %s µs (%+.1f), the plugin %s against %s (%+.1f). Every difference of two configurations above carries "+
			"that much from the processes alone, so the layers ((9) − (1), (11) − (9)) are estimates to within it; the "+
			"operations, 50 or 100 per request, are not affected.\n",
			attribTwinNull, attribTwinPlugin, f(spreadNull, 1), f(null, 1), spreadNull.Median-null.Median,
			f(twinPlug, 1), f(plug, 1), twinPlug.Median-plug.Median)
	}
	if okFloor && okNull {
		fmt.Fprintf(&md, "\n## What the floors mean for issue 11's targets\n\n"+
			"- Envoy CPU per request within 10 µs of (9): the Go floor alone, a Go module whose callbacks do nothing, is "+
			"%+.1f µs over (9)", floor.Median-null.Median)
		if okPath {
			fmt.Fprintf(&md, "; with only the host operations (3) makes, and none of its own code, %+.1f µs", predicted-null.Median)
			if okSpread {
				fmt.Fprintf(&md, " (two Envoys running (9) differed by %+.1f µs in this run)", spreadNull.Median-null.Median)
			}
			if okPlug {
				fmt.Fprintf(&md, ". The plugin is %+.1f µs above that sum: its own cost inside Envoy, beyond its host "+
					"operations' price in loops, is what keeps it from the target", plug.Median-predicted)
			}
		}
		fmt.Fprintf(&md, ".\n")
		if len(rel[11]) > 0 {
			fmt.Fprintf(&md, "- Throughput at least 0.85 × (1): the Go floor reaches %.3f × (1) (median of the rounds' ratios)", spreadOf(rel[11]).Median)
			if okPath {
				fmt.Fprintf(&md, "; with (3)'s host operations added, Envoy's one saturated worker would reach at most %.3f × (1) "+
					"((1)'s CPU per request over that sum)", none.Median/predicted)
			}
			fmt.Fprintf(&md, ".\n")
		}
		if len(rel[attribRejectID]) > 0 {
			floorRej := spreadOf(rel[attribRejectID]).Median
			fmt.Fprintf(&md, "- Rejecting throughput at least 0.85 × native rejecting (5): the Go floor rejecting one request in two "+
				"reaches %.3f × (1) with no decision at all. Native local_ratelimit rejecting about half is faster than (1): "+
				"it skips the upstream for those", floorRej)
			// (5) needs make bench's calibration: its ratio to (1) comes
			// from the last full run, in the same directory.
			if rep, err := readReport(filepath.Join(p.out, "results.json")); err == nil {
				if r5 := rep.result(5); r5 != nil && r5.ThrVs1.Median > 0 {
					v := r5.ThrVs1.Median
					fmt.Fprintf(&md, " ((5) ÷ (1) = %.3f in the full run of %s, README.md), so the floor reaches about %.3f × (5)", v, rep.Info.Date, floorRej/v)
				}
			}
			fmt.Fprintf(&md, ".\n")
		}
	}
	return b.writeDoc("attribution.md", md.String())
}
