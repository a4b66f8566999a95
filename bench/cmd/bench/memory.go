// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

// memOptions are the command-line flags.
type memOptions struct {
	home, plugin, perkey string
	keys                 []int
	maxKeys              int
	conns, concurrency   int
	settle               time.Duration
	md, png              string
}

func parseMemoryFlags(args []string) (memOptions, error) {
	var o memOptions
	fs := flag.NewFlagSet("bench memory", flag.ContinueOnError)
	fs.StringVar(&o.home, "func-e-home", os.Getenv("FUNC_E_DATA_HOME"), "func-e's data home with Envoy "+envoy.DefaultVersion+" (default $FUNC_E_DATA_HOME)")
	fs.StringVar(&o.plugin, "plugin", cmp.Or(os.Getenv("PLUGIN_WASM"), "build/plugin.wasm"), "the plugin (default $PLUGIN_WASM)")
	fs.StringVar(&o.perkey, "perkey", "build/perkey.wasm", "the one-key-per-client comparison plugin")
	keys := fs.String("keys", "1000,2000,5000,10000,20000,50000,100000,200000,500000,1000000",
		"checkpoints: distinct keys at which memory is sampled, increasing")
	fs.IntVar(&o.maxKeys, "max-keys", 100000, "the plugin's max_keys")
	fs.IntVar(&o.conns, "conns", 64, "concurrent keep-alive connections of the load generator")
	fs.IntVar(&o.concurrency, "concurrency", 2, "Envoy's --concurrency (worker threads)")
	fs.DurationVar(&o.settle, "settle", time.Second, "pause before each memory sample")
	fs.StringVar(&o.md, "md", "docs/memory.md", "Markdown report to write (empty: none)")
	fs.StringVar(&o.png, "png", "docs/memory.png", "PNG plot to write (empty: none)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.keys, err = parseCheckpoints(*keys); err != nil {
		return o, err
	}
	switch {
	case o.home == "":
		return o, fmt.Errorf("bench memory: -func-e-home: not set (run `make setup`, set FUNC_E_DATA_HOME)")
	case o.maxKeys < 16:
		return o, fmt.Errorf("bench memory: -max-keys: must be >= 16, got %d", o.maxKeys)
	case o.conns < 1 || o.conns > 1024:
		return o, fmt.Errorf("bench memory: -conns: must be 1..1024, got %d", o.conns)
	case o.concurrency < 1 || o.concurrency > 64:
		return o, fmt.Errorf("bench memory: -concurrency: must be 1..64, got %d", o.concurrency)
	case o.keys[0] <= warmupKeys:
		return o, fmt.Errorf("bench memory: -keys[0]: must be greater than the %d warm-up keys, got %d", warmupKeys, o.keys[0])
	case o.settle < 0 || o.settle > time.Minute:
		return o, fmt.Errorf("bench memory: -settle: must be 0..1m, got %v", o.settle)
	}
	for _, p := range []struct {
		flag string
		path *string
	}{{"-func-e-home", &o.home}, {"-plugin", &o.plugin}, {"-perkey", &o.perkey}} {
		if _, err := os.Stat(*p.path); err != nil {
			return o, fmt.Errorf("bench memory: %s: %w", p.flag, err)
		}
		if *p.path, err = filepath.Abs(*p.path); err != nil { // Envoy runs in a directory of its own
			return o, fmt.Errorf("bench memory: %s: %w", p.flag, err)
		}
	}
	return o, nil
}

// maxCheckpoint bounds every flood.
const maxCheckpoint = 10_000_000

// parseCheckpoints parses a comma-separated, strictly increasing list of
// positive key counts, at most maxCheckpoint.
func parseCheckpoints(s string) ([]int, error) {
	var out []int
	for i, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		switch {
		case err != nil:
			return nil, fmt.Errorf("bench memory: -keys[%d]: not an integer: %q", i, f)
		case n < 1 || n > maxCheckpoint:
			return nil, fmt.Errorf("bench memory: -keys[%d]: must be 1..%d, got %d", i, maxCheckpoint, n)
		case len(out) > 0 && n <= out[len(out)-1]:
			return nil, fmt.Errorf("bench memory: -keys[%d]: must be greater than %d, got %d", i, out[len(out)-1], n)
		}
		out = append(out, n)
	}
	return out, nil
}

// design is one storage design under test.
type design struct {
	name   string // short name, also the Wasm filter's name
	title  string // for the report and the legend
	wasm   string
	config string // the plugin configuration
	stats  string // RE2 filter of the /stats to report
}

// memSample is one measurement.
type memSample struct {
	keys    int    // distinct keys sent so far
	rss     uint64 // VmRSS, bytes
	alloc   uint64 // bytes in use in Envoy's allocator (/memory "allocated")
	stats   map[string]uint64
	elapsed time.Duration // of the flood that led to this sample
	rate    float64       // its requests per second
}

// memResult is one design's run.
type memResult struct {
	design
	baseline      uint64 // RSS after the warm-up
	allocBaseline uint64 // allocated bytes after the warm-up
	freeBaseline  uint64 // the allocator's free pages after the warm-up
	samples       []memSample
	statuses      map[int]int
}

// runMemory is `bench memory` (make bench-memory): Envoy's resident memory
// against the number of distinct client keys, for the plugin's bounded table
// (max_keys) and for a comparison plugin that stores one shared-data key per
// client (cmd/bench/perkeyplugin), written as a Markdown page and a PNG plot.
//
// The model: for each design it starts one Envoy (the Wasm filter, then a
// direct 200 response: no upstream), warms it up with requests that carry no
// key, samples VmRSS, then sends one request per new distinct x-api-key up
// to each checkpoint (cumulatively: 1k, then 1k more to 2k, ...) and samples
// VmRSS and the plugin's /stats after each. Every loop is bounded by the
// largest checkpoint; only loopback addresses are used. Proxy-wasm shared
// data is never freed, so the per-key plugin grows with every key while the
// bounded table stops growing once its groups exist.
//
//	bench memory [-func-e-home DIR] [-plugin PATH] [-perkey PATH] [-keys LIST]
//	             [-max-keys N] [-conns N] [-concurrency N] [-md FILE] [-png FILE]
func runMemory(args []string) error {
	o, err := parseMemoryFlags(args)
	if err != nil {
		return err
	}
	designs := []design{
		{
			name:  "tokenbucket",
			title: fmt.Sprintf("bounded table (max_keys %d)", o.maxKeys),
			wasm:  o.plugin,
			config: fmt.Sprintf(`{"max_keys": %d, "rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],`+
				` "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 50}}]}`, o.maxKeys),
			stats: `^wasmcustom\.tokenbucket\.(evictions|cas_retries|refunds|memory\.sys_bytes|rule\.per-key\..*)$`,
		},
		{
			name: "perkey", title: "one key per client", wasm: o.perkey, config: "{}",
			stats: `^wasmcustom\.perkey\..*$`,
		},
	}
	version := envoy.BinaryVersion(envoy.BinaryIn(o.home, envoy.DefaultVersion))
	var results []memResult
	for _, d := range designs {
		fmt.Printf("== %s (%s)\n", d.title, d.wasm)
		r, err := measureMemory(o, d)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	rep := memReport{
		when: time.Now().UTC(), envoy: version, concurrency: o.concurrency, cpus: runtime.NumCPU(),
		maxKeys: o.maxKeys, conns: o.conns, results: results, png: o.png,
	}
	fmt.Println()
	fmt.Print(rep.table())
	if o.md != "" {
		if err := os.WriteFile(o.md, []byte(rep.markdown()), 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", o.md)
	}
	if o.png != "" {
		if err := writePlot(o.png, results); err != nil {
			return err
		}
		fmt.Println("wrote", o.png)
	}
	return nil
}

// The warm-up sends warmupRequests requests cycling over the first
// warmupKeys keys before the baseline sample, so the Wasm code of the whole
// request path is compiled and tiered up, and the connections exist, before
// memory is measured.
const (
	warmupKeys     = 100
	warmupRequests = 30000
)

// measureMemory runs one design on its own Envoy.
func measureMemory(o memOptions, d design) (memResult, error) {
	r := memResult{design: d, statuses: map[int]int{}}
	// The plugin on every request, then Envoy answers 200 itself (a direct
	// response): no upstream takes CPU from Envoy on a small machine.
	e, err := envoy.Start(envoy.Options{Listeners: []envoy.Listener{{Wasm: d.wasm, RootID: d.name, VMID: d.name,
		PluginConfig: d.config}}, Concurrency: o.concurrency, LogLevel: "warn", Home: o.home})
	if err != nil {
		return r, err
	}
	defer e.Stop()
	addr := "127.0.0.1:" + strconv.Itoa(e.ListenerPort())
	const prefix = "client-"
	warm := flood{addr: addr, path: "/m", prefix: prefix, cycle: warmupKeys, conns: o.conns}
	if _, err := warm.run(0, warmupRequests); err != nil {
		return r, err
	}
	time.Sleep(o.settle)
	if r.baseline, err = e.RSS(); err != nil {
		return r, err
	}
	a, err := e.Memory()
	if err != nil {
		return r, err
	}
	r.allocBaseline, r.freeBaseline = a.Allocated, a.PageheapFree
	fmt.Printf("%10d keys  RSS %8.1f MiB  allocated %8.1f MiB (baseline)\n", warmupKeys, mb(r.baseline), mb(r.allocBaseline))
	f := flood{addr: addr, path: "/m", prefix: prefix, conns: o.conns}
	prev := warmupKeys
	for _, k := range o.keys {
		fr, err := f.run(prev, k)
		if err != nil {
			return r, err
		}
		for s, n := range fr.Statuses {
			r.statuses[s] += n
		}
		prev = k
		time.Sleep(o.settle)
		if e.Exited() {
			return r, fmt.Errorf("bench memory: %s: envoy exited\n%s", d.name, envoy.Tail(e.Log(), 40))
		}
		s := memSample{keys: k, elapsed: fr.Elapsed, rate: float64(fr.requests()) / fr.Elapsed.Seconds()}
		if s.rss, err = e.RSS(); err != nil {
			return r, err
		}
		a, err := e.Memory()
		if err != nil {
			return r, err
		}
		s.alloc = a.Allocated
		if s.stats, err = e.Stats(d.stats); err != nil {
			return r, err
		}
		r.samples = append(r.samples, s)
		fmt.Printf("%10d keys  RSS %8.1f MiB  allocated %8.1f MiB  (%.0f req/s, statuses %v)\n",
			k, mb(s.rss), mb(s.alloc), s.rate, fr.Statuses)
	}
	return r, nil
}

func mb(b uint64) float64 { return float64(b) / (1 << 20) }
