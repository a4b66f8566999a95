// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ratelimit-wasm/tokenbucket/bench/cmd/bench/nullwasm"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

// startConfig is the plugin's demo rule (envoy.yaml); a module other than
// the plugin ignores it.
const startConfig = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 5}}]}`

// startRequests are the requests sent after the first 200 before Envoy's
// resident memory is read, over startConns connections so that every
// worker's VM serves some.
const (
	startRequests = 1000
	startConns    = 8
)

// runStart is `bench start` (make bench-start): what Envoy spends from its
// start until its listener first answers 200 (the process's CPU time, user +
// system of all threads, and the wall time), and its resident memory (VmRSS)
// after 1000 more requests, at each --concurrency of -concurrency. It runs
// Envoy with no filter, with the no-op module of configuration (9) and with
// each module given, in turn, round after round, so that a change in the
// machine's load touches all of them alike. bench/footprint.md has
// its figures. Envoy's bootstrap is the project's: a listener whose route
// answers 200 directly.
//
//	bench start -rounds 3 -concurrency 1,2,4,8 floor=build/footprint/floor.wasm plugin=build/plugin.wasm
func runStart(args []string) error {
	fs := flag.NewFlagSet("bench start", flag.ContinueOnError)
	rounds := fs.Int("rounds", 3, "rounds (each runs every configuration once)")
	timeout := fs.Duration("timeout", 60*time.Second, "give up on one start after this long")
	concList := fs.String("concurrency", "1,2,4,8", "Envoy's --concurrency values, comma-separated (worker threads, one VM each); the start table is the first's")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var concs []int
	for _, s := range strings.Split(*concList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("bench start: -concurrency: %q is not a positive integer", s)
		}
		concs = append(concs, n)
	}
	dir, err := os.MkdirTemp("", "bench-start-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	noop := filepath.Join(dir, "null.wasm")
	if err := os.WriteFile(noop, nullwasm.Module, 0o644); err != nil {
		return err
	}
	runs := []startRun{{"no filter", ""}, {"no-op module", noop}}
	for _, a := range fs.Args() {
		name, path, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("bench start: arguments are name=module.wasm or name=module.so, got %s", a)
		}
		runs = append(runs, startRun{name, absPath(path)})
	}
	fmt.Printf("load average at the start: %s\n", loadAvg())
	type key struct {
		name string
		conc int
	}
	cpu, wall, rss := map[key][]float64{}, map[key][]float64{}, map[key][]float64{}
	alloc, free := map[key][]float64{}, map[key][]float64{}
	for r := 0; r < *rounds; r++ {
		for _, c := range concs {
			for _, ru := range runs {
				m, err := startOnce(ru.module, c, *timeout)
				if err != nil {
					return fmt.Errorf("bench start: %s, concurrency %d: %w", ru.name, c, err)
				}
				fmt.Printf("round %d  concurrency %d  %-14s cpu %6.2f s  wall %6.2f s  rss %6.1f MiB (allocator: %.1f allocated, %.1f free)\n",
					r+1, c, ru.name, m.cpu, m.wall, m.rssMiB, m.allocMiB, m.freeMiB)
				k := key{ru.name, c}
				cpu[k] = append(cpu[k], m.cpu)
				wall[k] = append(wall[k], m.wall)
				rss[k] = append(rss[k], m.rssMiB)
				alloc[k] = append(alloc[k], m.allocMiB)
				free[k] = append(free[k], m.freeMiB)
			}
		}
	}
	fmt.Printf("\nmedians over %d rounds (load average at the end: %s)\n\n", *rounds, loadAvg())
	fmt.Printf("start to the first 200, --concurrency %d\n\n", concs[0])
	fmt.Println("| configuration | CPU s (median) | wall s (median) | CPU s per round |")
	fmt.Println("|---|---:|---:|---|")
	for _, ru := range runs {
		k := key{ru.name, concs[0]}
		var each []string
		for _, c := range cpu[k] {
			each = append(each, strconv.FormatFloat(c, 'f', 2, 64))
		}
		fmt.Printf("| %s | %.2f | %.2f | %s |\n", ru.name, spreadOf(cpu[k]).Median, spreadOf(wall[k]).Median, strings.Join(each, ", "))
	}
	fmt.Printf("\nVmRSS MiB after %d requests (median), by --concurrency; the last column is the mean cost of one more worker\n\n", startRequests)
	head := "| configuration |"
	for _, c := range concs {
		head += " " + strconv.Itoa(c) + " |"
	}
	fmt.Println(head + " per extra worker |")
	fmt.Println("|---|" + strings.Repeat("---:|", len(concs)+1))
	base := spreadOf(rss[key{"no filter", concs[0]}]).Median
	for _, ru := range runs {
		line := "| " + ru.name + " |"
		var first, last float64
		for i, c := range concs {
			m := spreadOf(rss[key{ru.name, c}]).Median
			if i == 0 {
				first = m
			}
			last = m
			line += fmt.Sprintf(" %.1f", m)
			if i == 0 && ru.name != "no filter" {
				line += fmt.Sprintf(" (%+.1f)", m-base)
			}
			line += " |"
		}
		extra := "–"
		if n := concs[len(concs)-1] - concs[0]; n > 0 {
			extra = fmt.Sprintf("%.1f", (last-first)/float64(n))
		}
		fmt.Println(line + " " + extra + " |")
	}
	fmt.Printf("\nWhere the RSS is at --concurrency %d (MiB, medians): Envoy's allocator (tcmalloc's /memory) and the rest (memory V8 maps itself: compiled code, linear memories, isolates)\n\n", concs[0])
	fmt.Println("| configuration | RSS | allocated | allocator's free pages | outside the allocator |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, ru := range runs {
		k := key{ru.name, concs[0]}
		r, a, f := spreadOf(rss[k]).Median, spreadOf(alloc[k]).Median, spreadOf(free[k]).Median
		fmt.Printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", ru.name, r, a, f, r-a-f)
	}
	return nil
}

// startMeasure is one start: CPU and wall seconds until the first 200, and
// VmRSS after startRequests more.
// Allocated and free are what Envoy's allocator (tcmalloc) reports at the
// same moment: the rest of RSS is memory V8 maps itself (compiled code, the
// Wasm VMs' linear memories, the isolates' heaps) and Envoy's binary.
type startMeasure struct{ cpu, wall, rssMiB, allocMiB, freeMiB float64 }

// startRun is one configuration of a start: a name, and the module Envoy
// runs with startConfig (none, a Wasm module, or a dynamic module: a
// path ending in .so).
type startRun struct{ name, module string }

// startOptions are Envoy's options to run module ("" = no filter).
func startOptions(module string, concurrency int) envoy.Options {
	o := envoy.Options{PluginConfig: startConfig, Concurrency: concurrency, LogLevel: "error"}
	switch {
	case module == "":
		o.NoWasm = true
	case strings.HasSuffix(module, ".so"):
		o.Build, o.NativeModule = envoy.Native, module
	default:
		o.PluginWasm = module
	}
	return o
}

// startOnce runs Envoy once through the project's launcher (func-e) with
// module and measures it.
func startOnce(module string, concurrency int, timeout time.Duration) (m startMeasure, err error) {
	t0 := time.Now()
	p, err := envoy.Spawn(startOptions(module, concurrency))
	if err != nil {
		return m, err
	}
	defer p.Stop()
	tr := &http.Transport{MaxIdleConnsPerHost: startConns}
	defer tr.CloseIdleConnections()
	client := &http.Client{Timeout: time.Second, Transport: tr}
	for time.Since(t0) < timeout {
		if resp, err := client.Get(p.URL("/")); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				m.wall = time.Since(t0).Seconds()
				pid, err := p.PID()
				if err != nil {
					return m, err
				}
				if m.cpu, err = cpuSeconds(pid); err != nil {
					return m, err
				}
				if err := startLoad(client, p.URL("/")); err != nil {
					return m, err
				}
				mem, err := p.Memory()
				if err != nil {
					return m, err
				}
				rss, err := p.RSS()
				m.rssMiB, m.allocMiB, m.freeMiB = mb(rss), mb(mem.Allocated), mb(mem.PageheapFree)
				return m, err
			}
		}
		if p.Exited() {
			return m, fmt.Errorf("envoy exited:\n%s", envoy.Tail(p.Log(), 20))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return m, fmt.Errorf("no 200 on %s within %v", p.URL("/"), timeout)
}

// startLoad sends startRequests requests over startConns keep-alive
// connections, each with its own x-api-key (the demo rule's key: most are
// answered 429 once a key's burst is spent, which is fine here).
func startLoad(client *http.Client, url string) error {
	var wg sync.WaitGroup
	errs := make(chan error, startConns)
	for c := 0; c < startConns; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < startRequests; i += startConns {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("x-api-key", "key-"+strconv.Itoa(i%100))
				resp, err := client.Do(req)
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// startup is what starting Envoy with one configuration cost in `make
// bench`: medians over -start-rounds starts at --concurrency 1.
type startup struct {
	Name   string `json:"name"`
	CPU    spread `json:"cpu_s_to_first_200"`
	Wall   spread `json:"wall_s_to_first_200"`
	RSSMiB spread `json:"rss_mib_after_1000_requests"`
}

// starts measures Envoy's start with no filter, the plugin and the native
// module (when built), in turn, round after round: CPU and wall time until
// the first 200, and VmRSS after startRequests more (startOnce). Envoy
// runs on every CPU this process started with.
func (b *bench) starts() error {
	if b.p.startRounds == 0 {
		return nil
	}
	runs := []startRun{{"no filter", ""}, {"plugin", absPath(os.Getenv("PLUGIN_WASM"))}}
	if fileExists(b.p.module) {
		runs = append(runs, startRun{"native module", absPath(b.p.module)})
	}
	if b.pinned {
		// Envoys spawned from here inherit this process's CPU.
		if err := unix.SchedSetaffinity(0, &b.allCPUs); err != nil {
			return err
		}
		defer pinProcess(os.Getpid(), b.p.loadCPU)
	}
	cpu, wall, rss := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for r := range b.p.startRounds {
		for _, ru := range runs {
			m, err := startOnce(ru.module, 1, b.p.startTimeout)
			if err != nil {
				return fmt.Errorf("bench: start of %s: %w", ru.name, err)
			}
			b.logf("start %d %-14s CPU %.2f s, wall %.2f s to the first 200; RSS %.1f MiB after %d requests", r+1, ru.name, m.cpu, m.wall, m.rssMiB, startRequests)
			cpu[ru.name] = append(cpu[ru.name], m.cpu)
			wall[ru.name] = append(wall[ru.name], m.wall)
			rss[ru.name] = append(rss[ru.name], m.rssMiB)
		}
	}
	for _, ru := range runs {
		b.startups = append(b.startups, startup{Name: ru.name, CPU: spreadOf(cpu[ru.name]), Wall: spreadOf(wall[ru.name]), RSSMiB: spreadOf(rss[ru.name])})
	}
	return nil
}
