// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Command bench measures what rate limiting costs in Envoy: the same Envoy
// binary, listener, upstream and --concurrency with (1) no filter, (2)
// Envoy's native local_ratelimit per x-api-key value, never rejecting, (3)
// this plugin with one rule on x-api-key, never rejecting, (4) the plugin and
// (5) the native filter limited to reject about half the requests, and (6) a
// cluster rule through the limit service (build/limitd), when it is built,
// and (11) the same rule in lease mode ("sync": "lease"), whose limitd calls
// per 1000 requests the report gives. Four diagnostic configurations split the plugin's cost (-diag, on by
// default): (7) the plugin whose rule never applies, (8) the plugin without
// response headers, (9) the Wasm filter running a module that does nothing,
// (10) that module calling the host 10 times per request.
//
// The model:
//
//   - Envoy runs with --concurrency 1 pinned to CPU 0; this process (load
//     generator, upstream, orchestration) and limitd are pinned to CPU 1.
//     All six Envoys run side by side for the whole benchmark; only the one
//     under load uses CPU.
//   - The load generator is in-process: HTTP/1.1 keep-alive on loopback,
//     with requests cycling through -keys x-api-key values. A saturation run
//     is a closed loop (-conns connections, each sending as soon as the
//     previous answer arrived); a latency run is an open loop at a fixed
//     rate on -open-conns connections: -load times the no-filter saturated
//     throughput measured in a calibration pass.
//   - Each of -rounds rounds runs every configuration once, the order
//     reversed every other round (A B … B A …) so that drift cancels.
//     Results are medians across rounds, with the minimum and maximum.
//   - Envoy's CPU per request comes from utime + stime in /proc/<pid>/stat
//     over the measuring window (10 ms ticks); its memory is VmRSS.
//   - The rejecting configurations get the per-key limit that rejects half
//     of a closed loop's requests when Envoy has its core to itself:
//     1 / (CPU of an allowed request + CPU of a rejected one), the first
//     from the non-rejecting twin, the second measured (full runs) in a
//     first try. Their fixed-rate runs use as many keys as make the offered
//     rate per key twice the per-key limit.
//
// Every run is bounded in time; nothing leaves loopback. Output: README.md
// (tables, method, machine, versions), results.json and PNG plots in -out.
//
// The program is part of the benchmark lab's module (bench/) but runs from
// the repository root, as the Makefile runs it (build/bench): its default
// paths (docs/benchmarks, build/..., README.md for -front) are relative to
// the working directory.
//
//	bench                        full run into docs/benchmarks
//	bench -smoke -out build/bench-smoke   a few seconds per configuration
//	bench memory -h              memory against distinct keys (memory.go)
//	bench start -h               Envoy's start cost per module (start.go)
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

// params are the command-line settings.
type params struct {
	rounds       int
	warmup       time.Duration
	satWindow    time.Duration
	latWindow    time.Duration
	calWindow    time.Duration
	prime        time.Duration
	conns        int
	openConns    int
	keys         int
	load         float64
	out          string
	limitd       string
	only         string
	smoke        bool
	diag         bool
	render       string
	front        string
	correct      bool
	envoyCPU     int
	loadCPU      int
	noPin        bool
	startTimeout time.Duration
	perf         time.Duration
	attrib       bool
	opsWasm      string
	compareWasm  string
	module       string
	startRounds  int
	ratelimit    string
	rls          bool
	rlsOnly      bool
	rlsLimitd    string
	rlsBefore    string
	rlsFloor     string
	rlqs         bool
	rlqsOnly     bool
	rlqsRatio    bool
	// ordinary runs the ordinary-load regime alone (ordinary.go);
	// compareModule is another build of the module it runs beside -module.
	ordinary      bool
	compareModule string
	ordinaryPerf  time.Duration
}

func parseParams(args []string) (*params, error) {
	p := &params{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&p.rounds, "rounds", 4, "rounds; each runs every configuration once")
	fs.DurationVar(&p.warmup, "warmup", time.Second, "load before each measuring window")
	fs.DurationVar(&p.satWindow, "sat", 3*time.Second, "measuring window of a saturation run")
	fs.DurationVar(&p.latWindow, "lat", 3*time.Second, "measuring window of a fixed-rate latency run")
	fs.DurationVar(&p.calWindow, "cal", 3*time.Second, "measuring window of a calibration run")
	fs.DurationVar(&p.prime, "prime", 2*time.Second, "unmeasured load right after each Envoy starts (V8 tiers up)")
	fs.IntVar(&p.conns, "conns", 32, "connections of the closed loop")
	fs.IntVar(&p.openConns, "open-conns", 16, "connections of the open loop (the ordinary-load regime: issue 43's 16)")
	fs.IntVar(&p.keys, "keys", 100, "distinct x-api-key values, used in turn")
	fs.Float64Var(&p.load, "load", 0.5, "latency runs: offered rate as a fraction of the no-filter saturation throughput")
	fs.StringVar(&p.out, "out", "docs/benchmarks", "directory for README.md, results.json and the plots")
	fs.StringVar(&p.limitd, "limitd", "build/limitd", "limit service binary for configuration 6 (skipped when absent)")
	fs.StringVar(&p.only, "only", "", "comma-separated configuration numbers to run (default 1-6 and 11, and 7-10 with -diag; with -attrib, of the attribution's configurations)")
	fs.BoolVar(&p.diag, "diag", true, "also run the diagnostic configurations 7 (plugin whose rule never applies), 8 (plugin without response headers), 9 (a no-op Wasm module) and 10 (the same with 10 host calls per request)")
	fs.StringVar(&p.render, "render", "", "no measuring: rewrite a page in -out from the results its run saved: README.md, the plots and -front's cost sentence from results.json; attribution.md from attribution.json; perf.md from perf.json; ordinary.md from ordinary.json")
	fs.StringVar(&p.front, "front", "README.md", "the front page whose cost sentence (between its markers) a full run or -render rewrites; empty: none (the default with -smoke, -attrib and -perf)")
	fs.BoolVar(&p.smoke, "smoke", false, "short run: 1 round, short windows, no rate correction")
	fs.BoolVar(&p.correct, "correct", true, "re-calibrate the rejecting configurations once for ~50% rejections")
	fs.IntVar(&p.envoyCPU, "envoy-cpu", 0, "CPU Envoy is pinned to")
	fs.IntVar(&p.loadCPU, "load-cpu", 1, "CPU this process (generator, upstream) and limitd are pinned to")
	fs.BoolVar(&p.noPin, "no-pin", false, "do not pin processes to CPUs")
	fs.DurationVar(&p.startTimeout, "start-timeout", 3*time.Minute, "bound on each Envoy start")
	fs.BoolVar(&p.attrib, "attrib", false, "instead of the rounds: the attribution configurations (the Go floor and one host operation each, with (1) and (9)), saturation runs only, into attribution.md (make bench-attrib)")
	fs.StringVar(&p.opsWasm, "ops-wasm", "build/bench-ops.wasm", "the attribution module (bench/internal/footprint/ops), for -attrib")
	fs.StringVar(&p.compareWasm, "compare-wasm", "", "with -attrib: another build of the plugin, run with (3)'s rule as one more listener of (23), so a change is measured against PLUGIN_WASM in one Envoy")
	fs.StringVar(&p.module, "module", envOr("NATIVE_MODULE", envoy.DefaultNativeModule()), "the native module (make build-native) for configurations 12 and 15 (a gap when absent)")
	fs.IntVar(&p.startRounds, "start-rounds", 3, "starts of Envoy with no filter, the plugin and the native module, each measured from start to the first 200 and its RSS after 1000 requests (0: none)")
	fs.StringVar(&p.ratelimit, "ratelimit", envOr("RATELIMIT_BIN", "build/envoy-ratelimit/service_cmd"), "envoyproxy/ratelimit's server (make build-ratelimit) for the RLS section (a gap when absent)")
	fs.BoolVar(&p.rls, "rls", true, "also run the RLS section: Envoy's ratelimit filter against envoyproxy/ratelimit and limitd, and the plugin's cluster rule, each with a redis-server of its own (rls.go)")
	fs.StringVar(&p.rlsBefore, "rls-limitd-before", "", "a second limitd (an earlier build) the RLS section also runs, token buckets beside the others in the same rounds (empty: none)")
	fs.StringVar(&p.rlsFloor, "rls-limitd-floor", "", "limitd built with -tags benchfloor (make bench: build/limitd-floor), run beside the others as the floor under one script call per decision (empty: none)")
	fs.StringVar(&p.rlsLimitd, "rls-limitd", "", "limitd for the RLS section, built with its symbols so that its profile names functions (make bench-rls: build/limitd-symbols; default -limitd)")
	fs.BoolVar(&p.rlsOnly, "rls-only", false, "run only the RLS section and put it into -out's results.json (kept otherwise), then rewrite -out's README.md (make bench-rls)")
	fs.BoolVar(&p.rlqs, "rlqs", true, "also run the RLQS section: Envoy's rate_limit_quota filter against limitd's RLQS beside no filter, local_ratelimit and the plugin's and the native module's leases, each limitd with a redis-server of its own (rlqs.go)")
	fs.BoolVar(&p.rlqsRatio, "rlqs-ratio", false, "with -rlqs-only: only the saturation rounds of no filter, local_ratelimit and the quota filter with and without token buckets, and only printed (the CPU ratios, with the load), -out untouched: a quick look on a quiet machine (make bench-rlqs-ratio)")
	fs.BoolVar(&p.rlqsOnly, "rlqs-only", false, "run only the RLQS section and put it into -out's results.json (kept otherwise), then rewrite -out's README.md (make bench-rlqs)")
	fs.BoolVar(&p.ordinary, "ordinary", false, "instead of the rounds: the ordinary-load regime (ordinary.go): no filter, local_ratelimit with and without RateLimit headers, the native module with and without, the plugin, at a fixed rate of -load × no filter's saturated throughput and saturated, Envoy pinned; prints the table and writes ordinary.md into -out (make bench-ordinary). -conns and -open-conns default to 16, -rounds to 3")
	fs.DurationVar(&p.ordinaryPerf, "ordinary-perf", 0, "with -ordinary: after the rounds, profile each Envoy at the fixed rate for this long with perf and attribute its samples by thread, DSO and symbol (0: no profile)")
	fs.StringVar(&p.compareModule, "compare-module", "", "with -ordinary: another build of the native module, run as configuration 20 beside -module's (12), so a change is measured in one run")
	fs.DurationVar(&p.perf, "perf", 0, "instead of the rounds: profile each configuration's Envoy under load for this long with perf, split by DSO, into perf.md (make bench-perf)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if (p.smoke || p.attrib || p.perf > 0 || p.rlsOnly || p.rlqsOnly || p.ordinary) && !set["front"] {
		p.front = ""
	}
	if p.ordinary {
		for name, v := range map[string]*int{"conns": &p.conns, "open-conns": &p.openConns, "rounds": &p.rounds} {
			if !set[name] {
				*v = map[string]int{"conns": 16, "open-conns": 16, "rounds": 3}[name]
			}
		}
	}
	if p.smoke {
		p.startRounds = min(p.startRounds, 1)
		p.rounds = 1
		p.warmup = 500 * time.Millisecond
		p.satWindow = 1500 * time.Millisecond
		p.latWindow = 1500 * time.Millisecond
		p.calWindow = time.Second
		p.prime = time.Second
		p.correct = false
		p.diag = false
	}
	switch {
	case p.rounds < 1 || p.rounds > 50:
		return nil, fmt.Errorf("bench: -rounds: want 1..50, got %d", p.rounds)
	case p.conns < 1 || p.conns > 1000:
		return nil, fmt.Errorf("bench: -conns: want 1..1000, got %d", p.conns)
	case p.openConns < 1 || p.openConns > 1000:
		return nil, fmt.Errorf("bench: -open-conns: want 1..1000, got %d", p.openConns)
	case p.keys < 1 || p.keys > 100000:
		return nil, fmt.Errorf("bench: -keys: want 1..100000, got %d", p.keys)
	case p.load <= 0 || p.load > 1:
		return nil, fmt.Errorf("bench: -load: want (0, 1], got %v", p.load)
	case p.ordinaryPerf < 0 || p.ordinaryPerf > time.Minute || p.ordinaryPerf > 0 && !p.ordinary:
		return nil, fmt.Errorf("bench: -ordinary-perf: want [0, 1m] with -ordinary, got %v", p.ordinaryPerf)
	case p.perf < 0 || p.perf > time.Minute:
		return nil, fmt.Errorf("bench: -perf: want [0, 1m], got %v", p.perf)
	case p.rlsOnly && (p.attrib || p.perf > 0 || p.render != "" || p.rlqsOnly):
		return nil, errors.New("bench: -rls-only runs alone: not with -attrib, -perf, -render or -rlqs-only")
	case p.rlqsOnly && (p.attrib || p.perf > 0 || p.render != ""):
		return nil, errors.New("bench: -rlqs-only runs alone: not with -attrib, -perf or -render")
	case p.ordinary && (p.attrib || p.perf > 0 || p.render != "" || p.rlsOnly || p.rlqsOnly):
		return nil, errors.New("bench: -ordinary runs alone: not with -attrib, -perf, -render, -rls-only or -rlqs-only")
	case p.compareModule != "" && !p.ordinary:
		return nil, errors.New("bench: -compare-module needs -ordinary")
	case p.compareModule != "" && !fileExists(p.compareModule):
		return nil, fmt.Errorf("bench: -compare-module %q: no such file", p.compareModule)
	case p.compareWasm != "" && !p.attrib:
		return nil, errors.New("bench: -compare-wasm needs -attrib")
	case p.compareWasm != "" && !fileExists(p.compareWasm):
		return nil, fmt.Errorf("bench: -compare-wasm %q: no such file", p.compareWasm)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"warmup", p.warmup}, {"sat", p.satWindow}, {"lat", p.latWindow}, {"cal", p.calWindow}, {"prime", p.prime}} {
		if d.v <= 0 || d.v > time.Minute {
			return nil, fmt.Errorf("bench: -%s: want (0, 1m], got %v", d.name, d.v)
		}
	}
	return p, nil
}

// selected returns the configurations -only names, in order.
func (p *params) selected() ([]setup, error) {
	if p.ordinary {
		return p.ordinarySelection(), nil
	}
	var all []setup
	if p.attrib {
		// (1) no filter, (9) the no-op module, then the plugin's (3), (7)
		// and (8), against which the operations are added up, and a second
		// Envoy each for (9) and (3): how far apart two Envoys with the same
		// configuration measure.
		all = []setup{setups[0], setups[8], setups[2], setups[6], setups[7]}
		all = append(append(all, attribSetups...), twin(setups[8], attribTwinNull), twin(setups[2], attribTwinPlugin))
		all = append(all, splitSetup, layersSetup)
		if p.only == "" {
			return all, nil
		}
	} else {
		all = setups
	}
	if p.only == "" {
		var out []setup
		for _, s := range setups {
			if p.diag || !s.isDiag() {
				out = append(out, s)
			}
		}
		return out, nil
	}
	want := map[int]bool{}
	for _, f := range strings.Split(p.only, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || !slices.ContainsFunc(all, func(s setup) bool { return s.ID == n }) {
			return nil, fmt.Errorf("bench: -only: %q is not a configuration number of this run", f)
		}
		want[n] = true
	}
	var out []setup
	for _, s := range all {
		if want[s.ID] {
			out = append(out, s)
		}
	}
	return out, nil
}

// modes are the other benchmarks, each with flags of its own: `bench
// memory` (make bench-memory) and `bench start` (make bench-start).
var modes = map[string]func(args []string) error{"memory": runMemory, "start": runStart}

func main() {
	var err error
	if len(os.Args) > 1 && modes[os.Args[1]] != nil {
		err = modes[os.Args[1]](os.Args[2:])
	} else {
		var p *params
		if p, err = parseParams(os.Args[1:]); err == nil {
			err = run(p)
		}
	}
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// envOr is the environment variable name, or def when it is unset.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(p *params) error {
	if p.render != "" && filepath.Base(p.render) != "results.json" {
		return renderPage(p.render, p.out)
	}
	if p.render != "" {
		rep, err := readReport(p.render)
		if err != nil {
			return err
		}
		if err := rep.write(p.out); err != nil {
			return err
		}
		if p.front != "" {
			return rep.writeFront(p.front)
		}
		return nil
	}
	sel, err := p.selected()
	if err != nil {
		return err
	}
	b := &bench{p: p, started: time.Now()}
	defer b.close()
	// SIGINT or SIGTERM: stop the Envoys and limitd before exiting.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "bench: interrupted, stopping")
		b.close()
		os.Exit(1)
	}()
	if err := b.prepare(); err != nil {
		return err
	}
	if p.rlsOnly {
		return b.rlsOnly()
	}
	if p.rlqsOnly {
		return b.rlqsOnly()
	}
	if err := b.startAll(sel); err != nil {
		return err
	}
	if p.perf > 0 {
		return b.perfRun()
	}
	if p.ordinary {
		return b.ordinaryRun()
	}
	if p.attrib {
		return b.attribRun()
	}
	if err := b.calibrate(); err != nil {
		return err
	}
	if err := b.rounds(); err != nil {
		return err
	}
	if err := b.verify(); err != nil {
		return err
	}
	if err := b.starts(); err != nil {
		return err
	}
	if p.rls || p.rlqs {
		// The rounds' Envoys are idle from here on: stop them, so that the
		// RLS and RLQS sections' processes have the machine.
		for _, t := range b.targets {
			b.stopEnvoy(t)
		}
	}
	if p.rls {
		if err := b.rlsRun(); err != nil {
			return err
		}
	}
	if p.rlqs {
		if err := b.rlqsRun(); err != nil {
			return err
		}
	}
	b.info.Machine.LoadEnd = loadAvg()
	b.info.Duration = time.Since(b.started).Round(time.Second).String()
	rep := b.report()
	if err := rep.write(p.out); err != nil {
		return err
	}
	if p.front != "" {
		if err := rep.writeFront(p.front); err != nil {
			return err
		}
	}
	fmt.Printf("\n%s\nwrote %s (%s)\n", rep.summary(), p.out, b.info.Duration)
	return nil
}

// renderPage rewrites the page whose saved results are at path (by its
// name: attribution.json, perf.json, ordinary.json) into out.
func renderPage(path, out string) error {
	var page, md string
	switch filepath.Base(path) {
	case "attribution.json":
		var m attribData
		if err := readJSON(path, &m); err != nil {
			return err
		}
		page, md = "attribution.md", m.doc()
	case "perf.json":
		var m perfData
		if err := readJSON(path, &m); err != nil {
			return err
		}
		page, md = "perf.md", m.doc()
	case "ordinary.json":
		var m ordinaryData
		if err := readJSON(path, &m); err != nil {
			return err
		}
		page, md = "ordinary.md", m.doc()
	default:
		return fmt.Errorf("bench: -render %s: want results.json, attribution.json, perf.json or ordinary.json", path)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, page), []byte(md), 0o644)
}

// rlsOnly runs the RLS section alone and puts it into the report in -out
// (a new one when there is none), whose page it rewrites.
func (b *bench) rlsOnly() error {
	if err := b.rlsRun(); err != nil {
		return err
	}
	return b.writeSection(b.rls.Duration, b.rls.LoadEnd, func(rep *report) { rep.RLS = b.rls }, (*report).rlsSummary)
}

// writeSection puts a section run alone (in duration, the load average
// loadEnd at its end) into the report in -out with put (a new report when
// there is none), rewrites the page and prints the section's summary.
func (b *bench) writeSection(duration, loadEnd string, put func(rep *report), summary func(rep *report) string) error {
	rep, err := readReport(filepath.Join(b.p.out, "results.json"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		b.info.Duration, b.info.Machine.LoadEnd = duration, loadEnd
		rep = &report{Info: b.info}
	case err != nil:
		return err
	}
	put(rep)
	if err := rep.write(b.p.out); err != nil {
		return err
	}
	fmt.Printf("\n%s\nwrote %s (%s)\n", summary(rep), b.p.out, duration)
	return nil
}
