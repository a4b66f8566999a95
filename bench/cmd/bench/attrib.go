// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/loopback"
)

// attribOps is how many operations per request an attribution setup makes:
// enough that their cost stands out of the run-to-run noise (±10 µs here).
// Adding response headers makes 50: the load generator reads at most 100
// header lines.
const attribOps = 100

// attribN is the operations per request of each attribution setup, by ID.
var attribN = map[int]int{}

// The configurations the attribution page compares everything with, by the
// names the main report gives them (setups' labels): the page names every
// configuration, never its number.
var (
	nameNone   = setups[0].Label // no filter
	nameNull   = setups[8].Label // the no-op Wasm module
	namePlugin = setups[2].Label // the plugin with the standard local rule
)

// nameFloor is internal/footprint/ops doing nothing: the SDK and
// the Go runtime's entry into each callback.
const nameFloor = "Go floor"

// attribSetups isolate each kind of work the plugin makes per request, for
// `make bench-attrib`: the Go floor (internal/footprint/ops doing nothing:
// the SDK and the Go runtime's entry into each callback) and the
// same module making attribOps of one host operation per request. They run
// with no filter and the no-op Wasm module written in WebAssembly text.
var attribSetups = []setup{
	opsSetup(11, "none", "the SDK, callbacks do nothing"),
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

// layersSetup is one Envoy with a listener per layer of the plugin's cost
// (layers), all on its one worker: each round loads them in turn, so that
// their differences, like splitSets', carry no spread between processes.
var layersSetup = setup{ID: 23, Name: "layers", Label: "one Envoy, a listener per layer", Plot: "layers", Kind: kindPlugin}

// layer is one listener of layersSetup: its module ("" none, "null" the
// no-op module, "null-path" the no-op module making the plugin's host calls,
// "ops" internal/footprint/ops, "plugin"), its configuration, and the layer
// it is compared with (its index in layers; -1 none).
type layer struct {
	name, module string
	config       func(limit) string
	base         int
}

// opsLayer is the Go floor making op n times per request, compared with
// the Go floor.
func opsLayer(name, op string, n int) layer {
	cfg := op + " " + strconv.Itoa(n)
	return layer{name, "ops", func(limit) string { return cfg }, layerFloor}
}

// The indexes in layers of the no-op module, the no-op module making the
// plugin's host calls, the Go floor, its first single operation and the Go
// floor making all of them.
const (
	layerNull     = 1
	layerNullPath = 2
	layerFloor    = 3
	layerOnce     = 4
	layerPath     = 10
	layerPlugin   = 11
)

var layers = []layer{
	{nameNone, "", nil, -1},
	{nameNull, "null", idleRule, 0},
	{nameNull + " making the plugin's host operations once each (WebAssembly text)", "null-path", idleRule, layerNull},
	{nameFloor, "ops", func(limit) string { return "none 0" }, layerNull},
	opsLayer("Go floor + 1 request-header read", "get_header", 1),
	opsLayer("Go floor + 1 shared-data read", "get_shared_data", 1),
	opsLayer("Go floor + 1 shared-data write", "set_shared_data", 1),
	opsLayer("Go floor + 1 counter increment", "increment_metric", 1),
	opsLayer("Go floor + 1 host clock read", "host_time", 1),
	opsLayer("Go floor + 5 response headers", "add_header", 5),
	opsLayer("Go floor + the plugin's host operations, once each", "path", 1),
	{namePlugin, "plugin", pluginRule, layerPath},
}

// layers is the package's layers, and with -compare-wasm a last one: the
// plugin's local rule in that build of the plugin, compared with the plugin,
// for measuring a change before and after in one Envoy.
func (b *bench) layers() []layer {
	if b.p.compareWasm == "" {
		return layers
	}
	return append(slices.Clone(layers), layer{namePlugin + ", the -compare-wasm build", "compare", pluginRule, layerPlugin})
}

// layerListeners are layersSetup's listeners, on free ports, each module
// in a VM of its own.
func (b *bench) layerListeners(l limit) ([]envoy.Listener, error) {
	wasm := map[string]string{"null": b.nullWasm, "null-path": b.nullPath, "ops": absPath(b.p.opsWasm),
		"plugin": absPath(os.Getenv("PLUGIN_WASM")), "compare": absPath(b.p.compareWasm)}
	ls := b.layers()
	out := make([]envoy.Listener, len(ls))
	for i, ly := range ls {
		port, err := loopback.FreePort()
		if err != nil {
			return nil, err
		}
		name := "layer" + strconv.Itoa(i)
		out[i] = envoy.Listener{Name: name, StatPrefix: name, Port: port, Wasm: wasm[ly.module], VMID: name}
		if ly.config != nil {
			out[i].PluginConfig = ly.config(l)
		}
	}
	return out, nil
}

// reqSet is one request set sent to one listener of a target.
type reqSet struct {
	name string // "" for a target's only load
	addr string
	reqs [][]byte
}

// loads are what a round sends to t: one set, or for splitSetup and
// layersSetup one per request set or listener, in reverse in odd rounds so
// that drift cancels.
func (b *bench) loads(t *target, r int) []reqSet {
	var out []reqSet
	switch t.s.ID {
	case splitSetup.ID:
		for _, set := range splitSets {
			out = append(out, reqSet{set.name, b.addr(t), keyRequests(b.p.keys, set.header)})
		}
	case layersSetup.ID:
		for i, ly := range b.layers() {
			out = append(out, reqSet{ly.name, "127.0.0.1:" + strconv.Itoa(t.ports[i]), b.reqs})
		}
	default:
		return []reqSet{{"", b.addr(t), b.reqs}}
	}
	if r%2 == 1 {
		slices.Reverse(out)
	}
	return out
}

// withinRows is the table of the loads of target id (names in order): the
// CPU per request of each, and its difference from the load base(i) within
// each round (median, min…max; none where base(i) < 0); "" when they were
// not measured.
func withinRows(within map[string][]float64, id int, names []string, base func(i int) int) string {
	key := func(i int) string { return strconv.Itoa(id) + "/" + names[i] }
	if len(within[key(0)]) == 0 {
		return ""
	}
	var md strings.Builder
	fmt.Fprintln(&md, "| requests | Envoy CPU µs/req | compared with | difference |")
	fmt.Fprintln(&md, "|---|---:|---|---:|")
	for i, name := range names {
		xs := within[key(i)]
		with, d := "", ""
		if j := base(i); j >= 0 {
			dm := withinDiff(within, key(i), key(j))
			with, d = names[j], fmt.Sprintf("%+.1f (%+.1f…%+.1f)", dm.Median, dm.Min, dm.Max)
		}
		fmt.Fprintf(&md, "| %s | %s | %s | %s |\n", name, f(spreadOf(xs), 1), with, d)
	}
	return md.String()
}

// withinDiff is the spread of the round-by-round differences a − b of two
// loads of one target.
func withinDiff(within map[string][]float64, a, b string) spread {
	xs, ys := within[a], within[b]
	ds := make([]float64, min(len(xs), len(ys)))
	for k := range ds {
		ds[k] = xs[k] - ys[k]
	}
	return spreadOf(ds)
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

// opsSetupN is internal/footprint/ops making op n times per request; its
// label names the Go floor and what it adds: "Go floor + 100 × op-label",
// "Go floor, label" for rejecting and "Go floor (label)" for nothing.
func opsSetupN(id int, op, label string, n int) setup {
	attribN[id] = n
	cfg := fmt.Sprintf("%s %d", op, n)
	switch op {
	case "none":
		label = nameFloor + " (" + label + ")"
	case "reject":
		label = nameFloor + ", " + label
	default:
		label = fmt.Sprintf("%s + %d × %s", nameFloor, n, label)
	}
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
	m := attribData{cpu: map[int][]float64{}, thr: map[int][]float64{}, rel: map[int][]float64{}, within: map[string][]float64{}}
	for r := range p.rounds {
		round := map[int]float64{}
		for _, t := range roundOrder(b.targets, r) {
			ls := b.loads(t, r)
			for _, ld := range ls {
				s, err := saturate(ld.addr, b.probe(t), ld.reqs, p.conns, p.warmup, p.satWindow)
				if err == nil && (s.Errors > 0 || s.Requests == 0) {
					err = fmt.Errorf("%d errors in %d requests", s.Errors, s.Requests)
				}
				if err != nil {
					return fmt.Errorf("bench: round %d, (%d) %s %s: %w", r+1, t.s.ID, t.s.Label, ld.name, err)
				}
				b.logf("round %d (%d) %-50s %7.0f req/s %6.1f µs CPU/req", r+1, t.s.ID, cmp.Or(ld.name, t.s.Label), s.Throughput, s.CPUPerReqUS)
				if len(ls) > 1 {
					k := strconv.Itoa(t.s.ID) + "/" + ld.name
					m.within[k] = append(m.within[k], s.CPUPerReqUS)
					continue
				}
				m.cpu[t.s.ID] = append(m.cpu[t.s.ID], s.CPUPerReqUS)
				m.thr[t.s.ID] = append(m.thr[t.s.ID], s.Throughput)
				round[t.s.ID] = s.Throughput
			}
		}
		if base := round[1]; base > 0 {
			for id, x := range round {
				m.rel[id] = append(m.rel[id], x/base)
			}
		}
	}
	return b.writeDoc("attribution.md", b.attribDoc(m, b.info.Machine.LoadAvg, loadAvg()))
}

// attribData is what attribRun measured, round by round: each
// configuration's Envoy CPU per request, saturated throughput and its ratio
// to no filter, by ID; and the CPU per request of each load of a target with
// several (splitSetup, layersSetup), by "ID/load name".
type attribData struct {
	cpu, thr, rel map[int][]float64
	within        map[string][]float64
}

// em is a configuration's name in the page's prose: in italics, as the main
// report names configurations in its text.
func em(name string) string { return "*" + name + "*" }

// attribDoc renders attribution.md from m, with the load averages at the
// start and at the end of the run. It names every configuration (the
// names of the main report, setups' labels, for those it shares).
func (b *bench) attribDoc(m attribData, loadStart, loadEnd string) string {
	p := b.p
	cpu, thr, rel, within := m.cpu, m.thr, m.rel, m.within
	// tp is a configuration's saturated throughput and its ratio to no
	// filter within each round.
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
	none1, null9, floor11, plug3 := em(nameNone), em(nameNull), em(nameFloor), em(namePlugin)
	var md strings.Builder
	fmt.Fprintf(&md, "# Where the plugin's microseconds go: a cost per operation\n\n"+
		"Generated by `make bench-attrib` (`bench -attrib`): the same Envoy 1.40 (`--concurrency 1`, one listener, the same "+
		"upstream) with %s, the %s (written in WebAssembly text), and `bench/internal/footprint/ops`: the Go "+
		"floor (the SDK, callbacks that do nothing) and the same module making %d of one host operation per "+
		"request (%d adding response headers). Envoy CPU per request (utime + stime over a %v closed loop of %d connections) is the median of %d "+
		"interleaved rounds, min–max in brackets; an operation's cost is (that row − the Go floor) / n. Throughput is "+
		"the saturated req/s and its ratio to %s within each round (medians): with Envoy's one worker saturated it "+
		"follows the CPU per request. Load average at the start: %s; at the end: %s.\n\n",
		none1, null9, attribOps, attribN[16], p.satWindow, p.conns, p.rounds, none1, loadStart, loadEnd)
	fmt.Fprintf(&md, "| configuration | Envoy CPU µs/req | − previous layer | per operation | req/s | ÷ %s |\n", nameNone)
	fmt.Fprintln(&md, "|---|---:|---:|---:|---:|---:|")
	none, _ := med(1)
	null, okNull := med(9)
	floor, okFloor := med(11)
	fmt.Fprintf(&md, "| %s | %s | | | %s |\n", nameNone, f(none, 1), tp(1))
	if okNull {
		fmt.Fprintf(&md, "| %s (WebAssembly text): the Wasm filter itself | %s | %+.1f over %s | | %s |\n", nameNull, f(null, 1), null.Median-none.Median, nameNone, tp(9))
	}
	if okFloor {
		base := none
		if okNull {
			base = null
		}
		fmt.Fprintf(&md, "| %s: the Go runtime and SDK on each callback | %s | %+.1f over the %s | | %s |\n", nameFloor, f(floor, 1), floor.Median-base.Median, nameNull, tp(11))
	}
	for _, s := range attribSetups[1:] {
		m, ok := med(s.ID)
		if !ok || !okFloor {
			continue
		}
		d, n := m.Median-floor.Median, attribN[s.ID]
		if s.ID == attribRejectID {
			fmt.Fprintf(&md, "| %s | %s | %+.1f over the %s | | %s |\n", s.Label, f(m, 1), d, nameFloor, tp(s.ID))
			continue
		}
		fmt.Fprintf(&md, "| %s | %s | %+.1f over the %s | **%.2f µs** | %s |\n", s.Label, f(m, 1), d, nameFloor, d/float64(n), tp(s.ID))
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
			"The plugin's configurations of `make bench` in the same rounds. An allowed request of %s makes 1 request-header "+
			"read, 1 shared-data read and 1 write, 1 counter increment, 5 response headers and 1 clock read "+
			"([profile.md](../../bench/profile.md)); their costs above, added to the Go floor, are what the plugin would cost if its "+
			"own code were free.\n\n", plug3)
		fmt.Fprintf(&md, "| configuration | Envoy CPU µs/req | over the %s | over the %s | req/s | ÷ %s |\n", nameFloor, nameNull, nameNone)
		fmt.Fprintln(&md, "|---|---:|---:|---:|---:|---:|")
		for _, id := range []int{7, 8, 3} {
			m, ok := med(id)
			if !ok {
				continue
			}
			fmt.Fprintf(&md, "| %s | %s | %+.1f | %+.1f | %s |\n", setups[id-1].Label, f(m, 1), m.Median-floor.Median, m.Median-null.Median, tp(id))
		}
		if m, ok := med(attribTwinPlugin); ok {
			fmt.Fprintf(&md, "| %s | %s | %+.1f | %+.1f | %s |\n", twin(setups[2], attribTwinPlugin).Label, f(m, 1), m.Median-floor.Median, m.Median-null.Median, tp(attribTwinPlugin))
		}
		if okPath && okPlug {
			fmt.Fprintf(&md, "| the Go floor + the plugin's host operations | %.1f | %+.1f | %+.1f | | |\n", predicted, predicted-floor.Median, predicted-null.Median)
			fmt.Fprintf(&md, "\nSo of %s − %s = %+.1f µs, %+.1f is the Go floor, %+.1f the host operations the request path makes, "+
				"and %+.1f the rest: the plugin's own code as it runs inside Envoy, and host work the operations' loops do not "+
				"capture ([footprint.md](../../bench/footprint.md) splits it further with perf and with the guest alone under V8).\n",
				plug3, null9, plug.Median-null.Median, floor.Median-null.Median, predicted-floor.Median, plug.Median-predicted)
		}
	}
	splitNames := make([]string, len(splitSets))
	for i, set := range splitSets {
		splitNames[i] = set.name
	}
	if rows := withinRows(within, splitSetup.ID, splitNames, func(i int) int { return i - 1 }); rows != "" {
		fmt.Fprintf(&md, "\n## Within one Envoy\n\n"+
			"The configuration %s is the plugin with two rules that apply only when a request carries their header: a shadow rule (its "+
			"bucket, no response headers) and an enforced one (its bucket and the five RateLimit headers). Each round sends "+
			"three request sets to that same Envoy, so their differences carry no spread between processes. An allowed "+
			"decision makes 1 request-header read, 1 shared-data read and 1 write, 1 counter increment and 1 clock read; the "+
			"enforced rule adds 5 response headers.\n\n%s", em(splitSetup.Label), rows)
	}
	lys := b.layers()
	layerNames := make([]string, len(lys))
	for i, ly := range lys {
		layerNames[i] = ly.name
	}
	// lay holds the layers' findings within one Envoy, for the targets'
	// section: the host operations made once by a module with no code of
	// its own, over the no-op module; the Go floor over it; and the plugin
	// over it.
	var lay struct {
		ok                 bool
		bare, floor, total float64
		// maxThr is no filter's CPU per request over the bare module's:
		// the throughput ratio Envoy's one saturated worker reaches at
		// most with any module making the plugin's calls.
		maxThr float64
	}
	if rows := withinRows(within, layersSetup.ID, layerNames, func(i int) int { return lys[i].base }); rows != "" {
		key := func(i int) string { return strconv.Itoa(layersSetup.ID) + "/" + lys[i].name }
		diff := func(i, j int) float64 { return withinDiff(within, key(i), key(j)).Median }
		sum := 0.0
		for i := layerOnce; i < layerPath; i++ {
			sum += diff(i, layerFloor)
		}
		lay.ok, lay.bare, lay.floor, lay.total = true, diff(layerNullPath, layerNull), diff(layerFloor, layerNull), diff(layerPlugin, layerNull)
		lay.maxThr = spreadOf(within[key(0)]).Median / spreadOf(within[key(layerNullPath)]).Median
		fmt.Fprintf(&md, "\n## Every layer within one Envoy\n\n"+
			"The configuration %s has a listener per layer, all served by its one worker: no filter; the no-op module; the no-op "+
			"module making the host calls of the plugin's allowed request once each, with no code of its own "+
			"(`bench/cmd/bench/nullwasm/null-path.wat`: the x-api-key header, a shared-data read and CAS write of a 128-byte value "+
			"under it, a counter, the host clock and the five RateLimit headers); the Go floor; the Go floor making one kind "+
			"of those operations as often as the plugin makes it; the Go floor making all of them (`bench/internal/footprint/ops`, op "+
			"`path`); and %s. Each round loads the listeners in turn, so every difference below is within one "+
			"process.\n\n%s\n", em(layersSetup.Label), plug3, rows)
		fmt.Fprintf(&md, "- **The host operations alone**, made once each by a module with no code of its own, cost %+.1f µs over "+
			"the %s: the floor of any module that makes them, in any language.\n", lay.bare, null9)
		fmt.Fprintf(&md, "- Made by the Go floor, they cost %+.1f µs over it together and %+.1f one kind at a time (the sum of "+
			"the single rows)", diff(layerPath, layerFloor), sum)
		if okPath && okFloor {
			fmt.Fprintf(&md, ", against %.1f µs at the prices of the loops above: an operation's first call in a request costs "+
				"far more than its hundredth", predicted-floor.Median)
		}
		fmt.Fprintf(&md, ".\n- So %s − %s = %+.1f µs here is %+.1f of the Go floor, %+.1f of the host operations the Go floor "+
			"makes, and %+.1f of the plugin's own: its code, and anything its operations cost beyond the same ones made by a "+
			"module that does nothing else.\n", plug3, null9, lay.total, lay.floor, diff(layerPath, layerFloor), diff(layerPlugin, layerPath))
		if b.p.compareWasm != "" {
			fmt.Fprintf(&md, "- The -compare-wasm build (%s) against this one: %+.1f µs.\n", filepath.Base(b.p.compareWasm), diff(layerPlugin+1, layerPlugin))
		}
	}
	spreadNull, okSpread := med(attribTwinNull)
	if okSpread && okNull {
		twinPlug, _ := med(attribTwinPlugin)
		fmt.Fprintf(&md, "\n## How far apart two Envoys measure\n\n"+
			"The configurations %s and %s run the %s and %s again, each in a second Envoy, in the same rounds: the no-op module measured %s "+
			"against %s µs (%+.1f), the plugin %s against %s (%+.1f). Every difference of two configurations above carries "+
			"that much from the processes alone, so the layers (%s − %s, %s − %s) are estimates to within it; the "+
			"operations, 50 or 100 per request, are not affected.\n",
			em(twin(setups[8], attribTwinNull).Label), em(twin(setups[2], attribTwinPlugin).Label), null9, plug3,
			f(spreadNull, 1), f(null, 1), spreadNull.Median-null.Median,
			f(twinPlug, 1), f(plug, 1), twinPlug.Median-plug.Median, null9, none1, floor11, null9)
	}
	if okFloor && okNull {
		fmt.Fprintf(&md, "\n## What the floors mean for the plugin's cost targets\n\n"+
			"- Envoy CPU per request within 10 µs of the %s: ", null9)
		if lay.ok {
			verdict := "so the floors leave room for it"
			switch {
			case lay.bare > 10:
				verdict = "so the target is out of reach for any module making those calls"
			case lay.bare+lay.floor > 10:
				verdict = "so the target is out of reach for any Go module making those calls"
			}
			fmt.Fprintf(&md, "within one Envoy (above), the host operations of the plugin's allowed request made by a module with "+
				"no code of its own already cost %+.1f µs over the %s, and the Go floor %+.1f: %s. Across processes, ",
				lay.bare, null9, lay.floor, verdict)
		}
		fmt.Fprintf(&md, "the Go floor alone, a Go module whose callbacks do nothing, is "+
			"%+.1f µs over the %s", floor.Median-null.Median, null9)
		if okPath {
			fmt.Fprintf(&md, "; with only the host operations the plugin makes, and none of its own code, %+.1f µs", predicted-null.Median)
			if okSpread {
				fmt.Fprintf(&md, " (two Envoys running the %s differed by %+.1f µs in this run)", null9, spreadNull.Median-null.Median)
			}
			if okPlug {
				fmt.Fprintf(&md, ". The plugin is %+.1f µs above that sum: its own cost inside Envoy, beyond its host "+
					"operations' price in loops, is what keeps it from the target", plug.Median-predicted)
			}
		}
		fmt.Fprintf(&md, ".\n")
		if len(rel[11]) > 0 {
			fmt.Fprintf(&md, "- Throughput at least 0.85 × %s: the Go floor reaches %.3f × %s (median of the rounds' ratios)", none1, spreadOf(rel[11]).Median, none1)
			if okPath {
				fmt.Fprintf(&md, "; with the plugin's host operations added, Envoy's one saturated worker would reach at most %.3f × %s "+
					"(%s's CPU per request over that sum)", none.Median/predicted, none1, none1)
			}
			fmt.Fprintf(&md, ".")
			if lay.ok {
				fmt.Fprintf(&md, " Within one Envoy, any module making those calls, even one with no code of its own, reaches at "+
					"most %.3f × %s (%s's CPU per request over that module's, above).", lay.maxThr, none1, none1)
			}
			fmt.Fprintf(&md, "\n")
		}
		if len(rel[attribRejectID]) > 0 {
			floorRej := spreadOf(rel[attribRejectID]).Median
			native5 := em(setups[4].Label)
			fmt.Fprintf(&md, "- Rejecting throughput at least 0.85 × %s: the Go floor rejecting one request in two "+
				"reaches %.3f × %s with no decision at all. Native local_ratelimit rejecting about half is faster than %s: "+
				"it skips the upstream for those", native5, floorRej, none1, none1)
			// native, ~50% rejected needs make bench's calibration: its
			// ratio to no filter comes from the last full run, in the
			// same directory.
			if rep, err := readReport(filepath.Join(p.out, "results.json")); err == nil {
				if r5 := rep.result(5); r5 != nil && r5.ThrVs1.Median > 0 {
					v := r5.ThrVs1.Median
					fmt.Fprintf(&md, " (%s ÷ %s = %.3f in the full run of %s, README.md), so the floor reaches about %.3f × %s", native5, none1, v, rep.Info.Date, floorRej/v, native5)
				}
			}
			fmt.Fprintf(&md, ".\n")
		}
	}
	return md.String()
}
