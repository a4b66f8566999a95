// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"cmp"
	"encoding/json"
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

// attribLayers is the layers of this run (-compare-wasm adds one).
func (b *bench) attribLayers() []layer {
	m := attribData{}
	if b.p.compareWasm != "" {
		m.CompareWasm = filepath.Base(b.p.compareWasm)
	}
	return m.layers()
}

// layerListeners are layersSetup's listeners, on free ports, each module
// in a VM of its own.
func (b *bench) layerListeners(l limit) ([]envoy.Listener, error) {
	wasm := map[string]string{"null": b.nullWasm, "null-path": b.nullPath, "ops": absPath(b.p.opsWasm),
		"plugin": absPath(os.Getenv("PLUGIN_WASM")), "compare": absPath(b.p.compareWasm)}
	ls := b.attribLayers()
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
		for i, ly := range b.attribLayers() {
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
		fmt.Fprintf(&md, "| %s | %s | %s | %s |\n", name, fm(spreadOf(xs), 1), with, d)
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
// interleaved saturation runs, and writes attribution.md into -out, and
// beside it attribution.json, from which -render rewrites the page: what
// each layer and each host operation costs, from the differences of
// medians.
func (b *bench) attribRun() error {
	p := b.p
	m := &attribData{Date: b.info.Date, LoadStart: b.info.Machine.LoadAvg, Rounds: p.rounds, Conns: p.conns, SatWindow: p.satWindow.String(),
		CPU: map[int][]float64{}, Thr: map[int][]float64{}, Rel: map[int][]float64{}, Within: map[string][]float64{}}
	if p.compareWasm != "" {
		m.CompareWasm = filepath.Base(p.compareWasm)
	}
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
					m.Within[k] = append(m.Within[k], s.CPUPerReqUS)
					continue
				}
				m.CPU[t.s.ID] = append(m.CPU[t.s.ID], s.CPUPerReqUS)
				m.Thr[t.s.ID] = append(m.Thr[t.s.ID], s.Throughput)
				round[t.s.ID] = s.Throughput
			}
		}
		if base := round[1]; base > 0 {
			for id, x := range round {
				m.Rel[id] = append(m.Rel[id], x/base)
			}
		}
	}
	m.LoadEnd = loadAvg()
	// native, ~50% rejected needs make bench's calibration: its ratio to
	// no filter comes from the last full run, in the same directory.
	if rep, err := readReport(filepath.Join(p.out, "results.json")); err == nil {
		if r5 := rep.result(5); r5 != nil && r5.ThrVs1.Median > 0 {
			m.NativeRejected, m.NativeRejectedDate = r5.ThrVs1.Median, rep.Info.Date
		}
	}
	if err := writeJSON(filepath.Join(p.out, "attribution.json"), m); err != nil {
		return err
	}
	return b.writeDoc("attribution.md", m.doc())
}

// attribData is what attribRun measured, round by round, and how:
// each configuration's Envoy CPU per request, saturated throughput and its
// ratio to no filter, by ID; and the CPU per request of each load of a
// target with several (splitSetup, layersSetup), by "ID/load name". It is
// saved as attribution.json, from which -render writes the page again.
type attribData struct {
	Date        string               `json:"date"`
	LoadStart   string               `json:"loadavg_at_start"`
	LoadEnd     string               `json:"loadavg_at_end"`
	Rounds      int                  `json:"rounds"`
	Conns       int                  `json:"conns"`
	SatWindow   string               `json:"sat_window"`
	CompareWasm string               `json:"compare_wasm,omitempty"`
	CPU         map[int][]float64    `json:"envoy_cpu_us_per_req"`
	Thr         map[int][]float64    `json:"throughput_rps"`
	Rel         map[int][]float64    `json:"throughput_ratio_vs_1"`
	Within      map[string][]float64 `json:"within_one_envoy_cpu_us_per_req"`
	// NativeRejected is native, ~50% rejected ÷ no filter in the full run
	// of NativeRejectedDate (results.json beside the page), 0 without one.
	NativeRejected     float64 `json:"native_rejected_vs_1,omitempty"`
	NativeRejectedDate string  `json:"native_rejected_date,omitempty"`
}

// layers is the attribution's layers, and with -compare-wasm a last one:
// the plugin's local rule in that build of the plugin, compared with the
// plugin, for measuring a change before and after in one Envoy.
func (m *attribData) layers() []layer {
	if m.CompareWasm == "" {
		return layers
	}
	return append(slices.Clone(layers), layer{namePlugin + ", the -compare-wasm build", "compare", pluginRule, layerPlugin})
}

// em is a configuration's name in the page's prose: in italics, as the main
// report names configurations in its text.
func em(name string) string { return "*" + name + "*" }

// doc renders attribution.md from m. It names every configuration (the
// names of the main report, setups' labels, for those it shares).
func (m *attribData) doc() string {
	cpu, rel, within := m.CPU, m.Rel, m.Within
	// ratio is a configuration's saturated throughput ÷ no filter's within
	// each round (median).
	ratio := func(id int) string {
		if len(rel[id]) == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f", spreadOf(rel[id]).Median)
	}
	med := func(id int) (spread, bool) {
		xs, ok := cpu[id]
		if !ok {
			return spread{}, false
		}
		return spreadOf(xs), true
	}
	none1, null9, plug3 := em(nameNone), em(nameNull), em(namePlugin)
	var md strings.Builder
	fmt.Fprintf(&md, "# Where the plugin's microseconds go: a cost per operation\n\n"+
		"Generated by `make bench-attrib` (`bench -attrib`; `bench -render attribution.json` rewrites it) on %s, load average %s at the start and %s at the end; "+
		"measured as the [benchmark page](README.md#method) says, saturated only (%d connections, %s), %d rounds. "+
		"%s, the %s (WebAssembly text) and `bench/internal/footprint/ops`: the Go floor (the SDK, callbacks that do nothing) and the same module making %d of one host "+
		"operation per request (%d adding response headers); an operation's cost is (its row − the Go floor) ÷ n. *÷ %s*: saturated throughput, within each round.\n\n",
		m.Date, m.LoadStart, m.LoadEnd, m.Conns, m.SatWindow, m.Rounds, upperFirst(none1), null9, attribOps, attribN[16], nameNone)
	fmt.Fprintf(&md, "| configuration | Envoy CPU µs/req | over the previous layer | per operation µs | ÷ %s |\n", nameNone)
	fmt.Fprintln(&md, "|---|---:|---:|---:|---:|")
	none, _ := med(1)
	null, okNull := med(9)
	floor, okFloor := med(11)
	fmt.Fprintf(&md, "| %s | %s | | | %s |\n", nameNone, f(none, 1), ratio(1))
	if okNull {
		fmt.Fprintf(&md, "| %s | %s | %+.1f | | %s |\n", nameNull, f(null, 1), null.Median-none.Median, ratio(9))
	}
	if okFloor {
		base := none
		if okNull {
			base = null
		}
		fmt.Fprintf(&md, "| %s | %s | %+.1f | | %s |\n", nameFloor, f(floor, 1), floor.Median-base.Median, ratio(11))
	}
	for _, s := range attribSetups[1:] {
		x, ok := med(s.ID)
		if !ok || !okFloor {
			continue
		}
		d, n := x.Median-floor.Median, attribN[s.ID]
		if s.ID == attribRejectID {
			fmt.Fprintf(&md, "| %s | %s | %+.1f | | %s |\n", s.Label, f(x, 1), d, ratio(s.ID))
			continue
		}
		fmt.Fprintf(&md, "| %s | %s | %+.1f | **%.2f** | %s |\n", s.Label, f(x, 1), d, d/float64(n), ratio(s.ID))
	}
	// The plugin's allowed request makes these operations (make
	// bench-profile): the sum over the floor is what they alone cost.
	path := []struct {
		id, n int
	}{{15, 1}, {12, 1}, {13, 1}, {14, 1}, {16, 5}, {18, 1}}
	predicted, okPath := floor.Median, okFloor
	for _, op := range path {
		x, ok := med(op.id)
		okPath = okPath && ok
		predicted += (x.Median - floor.Median) / float64(attribN[op.id]) * float64(op.n)
	}
	plug, okPlug := med(3)
	if okFloor {
		fmt.Fprintf(&md, "\n## The plugin against its parts\n\n"+
			"An allowed request of %s makes 1 request-header read, 1 shared-data read and 1 write, 1 counter increment, 5 response headers and "+
			"1 clock read ([profile.md](../../bench/profile.md)); their costs above added to the Go floor are the plugin with its own code free.\n\n", plug3)
		fmt.Fprintf(&md, "| configuration | Envoy CPU µs/req | over the %s | over the %s | ÷ %s |\n", nameFloor, nameNull, nameNone)
		fmt.Fprintln(&md, "|---|---:|---:|---:|---:|")
		for _, id := range []int{7, 8, 3} {
			x, ok := med(id)
			if !ok {
				continue
			}
			fmt.Fprintf(&md, "| %s | %s | %+.1f | %+.1f | %s |\n", setups[id-1].Label, f(x, 1), x.Median-floor.Median, x.Median-null.Median, ratio(id))
		}
		if x, ok := med(attribTwinPlugin); ok {
			fmt.Fprintf(&md, "| %s | %s | %+.1f | %+.1f | %s |\n", twin(setups[2], attribTwinPlugin).Label, f(x, 1), x.Median-floor.Median, x.Median-null.Median, ratio(attribTwinPlugin))
		}
		if okPath && okPlug {
			fmt.Fprintf(&md, "| the Go floor + the plugin's host operations | %.1f | %+.1f | %+.1f | |\n", predicted, predicted-floor.Median, predicted-null.Median)
			fmt.Fprintf(&md, "\nOf %s − %s = %+.1f µs: %+.1f Go floor, %+.1f host operations, %+.1f the rest (the plugin's own code inside Envoy, and host work the loops do not capture).\n",
				plug3, null9, plug.Median-null.Median, floor.Median-null.Median, predicted-floor.Median, plug.Median-predicted)
		}
	}
	splitNames := make([]string, len(splitSets))
	for i, set := range splitSets {
		splitNames[i] = set.name
	}
	if rows := withinRows(within, splitSetup.ID, splitNames, func(i int) int { return i - 1 }); rows != "" {
		fmt.Fprintf(&md, "\n## Within one Envoy\n\n"+
			"%s: the plugin with a shadow rule (no response headers) and an enforced one (five RateLimit headers), each applying only to requests "+
			"carrying its header; each round sends three request sets to that one Envoy, so differences carry no spread between processes.\n\n%s",
			upperFirst(em(splitSetup.Label)), rows)
	}
	lys := m.layers()
	layerNames := make([]string, len(lys))
	for i, ly := range lys {
		layerNames[i] = ly.name
	}
	// lay holds the layers' findings within one Envoy: the host operations
	// made once by a module with no code of its own, over the no-op
	// module; the Go floor over it; and the plugin over it.
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
			"%s: a listener per layer, one worker. The no-op module making the plugin's host calls once each has no code of its own "+
			"(`bench/cmd/bench/nullwasm/null-path.wat`); the Go floor's rows make one kind as often as the plugin does, or all (op `path`).\n\n%s\n",
			upperFirst(em(layersSetup.Label)), rows)
		fmt.Fprintf(&md, "The host operations alone cost %+.1f µs over the %s (any module making them, in any language); made by the Go floor, %+.1f "+
			"together and %+.1f one kind at a time", lay.bare, null9, diff(layerPath, layerFloor), sum)
		if okPath && okFloor {
			fmt.Fprintf(&md, ", against %.1f at the loops' prices (a request's first call of an operation costs far more than its hundredth)", predicted-floor.Median)
		}
		fmt.Fprintf(&md, ". So %s − %s = %+.1f µs here: %+.1f Go floor, %+.1f its host operations, %+.1f the plugin's own.", plug3, null9, lay.total,
			lay.floor, diff(layerPath, layerFloor), diff(layerPlugin, layerPath))
		if m.CompareWasm != "" {
			fmt.Fprintf(&md, " The -compare-wasm build (%s) against this one: %+.1f µs.", m.CompareWasm, diff(layerPlugin+1, layerPlugin))
		}
		fmt.Fprintf(&md, "\n")
	}
	spreadNull, okSpread := med(attribTwinNull)
	if okSpread && okNull {
		twinPlug, _ := med(attribTwinPlugin)
		fmt.Fprintf(&md, "\n## How far apart two Envoys measure\n\n"+
			"A second Envoy each for the %s and %s, in the same rounds, measured %s (%+.1f) and %s (%+.1f) µs: differences between processes above "+
			"carry that much; the operations, 50 or 100 per request, do not.\n",
			null9, plug3, f(spreadNull, 1), spreadNull.Median-null.Median, f(twinPlug, 1), twinPlug.Median-plug.Median)
	}
	if okFloor && okNull {
		fmt.Fprintf(&md, "\n## What the floors mean for the plugin's cost targets\n\n- Envoy CPU within 10 µs of the %s: ", null9)
		if lay.ok {
			verdict := "the floors leave room for it"
			switch {
			case lay.bare > 10:
				verdict = "out of reach for any module making those calls"
			case lay.bare+lay.floor > 10:
				verdict = "out of reach for any Go module making those calls"
			}
			fmt.Fprintf(&md, "within one Envoy the host operations cost %+.1f and the Go floor %+.1f: %s. ", lay.bare, lay.floor, verdict)
		}
		fmt.Fprintf(&md, "Across processes the Go floor is %+.1f", floor.Median-null.Median)
		if okPath {
			fmt.Fprintf(&md, ", with the plugin's host operations %+.1f", predicted-null.Median)
			if okPlug {
				fmt.Fprintf(&md, "; the plugin is %+.1f above that: its own cost keeps it from the target", plug.Median-predicted)
			}
		}
		fmt.Fprintf(&md, ".\n")
		if len(rel[11]) > 0 {
			fmt.Fprintf(&md, "- Throughput at least 0.85 × %s: the Go floor reaches %.3f", none1, spreadOf(rel[11]).Median)
			if okPath {
				fmt.Fprintf(&md, ", with the plugin's host operations at most %.3f", none.Median/predicted)
			}
			if lay.ok {
				fmt.Fprintf(&md, "; within one Envoy, any module making those calls at most %.3f", lay.maxThr)
			}
			fmt.Fprintf(&md, ".\n")
		}
		if len(rel[attribRejectID]) > 0 {
			floorRej := spreadOf(rel[attribRejectID]).Median
			native5 := em(setups[4].Label)
			fmt.Fprintf(&md, "- Rejecting throughput at least 0.85 × %s: the Go floor rejecting one request in two reaches %.3f × %s with no decision",
				native5, floorRej, none1)
			if m.NativeRejected > 0 {
				fmt.Fprintf(&md, "; %s is %.3f × %s (it skips the upstream; the full run of %s), so the floor reaches about %.3f × %s",
					native5, m.NativeRejected, none1, m.NativeRejectedDate, floorRej/m.NativeRejected, native5)
			}
			fmt.Fprintf(&md, ".\n")
		}
	}
	return md.String()
}

// upperFirst is s with its first letter (after any emphasis) in upper case.
func upperFirst(s string) string {
	for i, r := range s {
		if r != '*' {
			return s[:i] + strings.ToUpper(string(r)) + s[i+len(string(r)):]
		}
	}
	return s
}

// writeJSON stores v, indented, at path.
func writeJSON(path string, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(js, '\n'), 0o644)
}

// readJSON loads what writeJSON stored at path into v.
func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("bench: %s: %w", path, err)
	}
	return nil
}
