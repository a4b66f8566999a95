// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/envoy"
)

// startConfig is the plugin's demo rule (envoy.yaml); a module other than
// the plugin ignores it.
const startConfig = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 5}}]}`

// runStart is `bench start` (make bench-start): what Envoy spends from its
// start until its listener first answers 200, with --concurrency 1
// (-concurrency): the process's CPU time (user + system, all threads) and the
// wall time. It runs each module given (and Envoy with no filter) in turn,
// round after round, so that a change in the machine's load touches all of
// them alike. docs/benchmarks/footprint.md has its figures. Envoy's
// bootstrap is the project's: a listener whose route answers 200 directly.
//
//	bench start -rounds 3 floor=build/footprint/floor.wasm plugin=build/plugin.wasm
func runStart(args []string) error {
	fs := flag.NewFlagSet("bench start", flag.ContinueOnError)
	rounds := fs.Int("rounds", 3, "rounds (each runs every configuration once)")
	timeout := fs.Duration("timeout", 60*time.Second, "give up on one start after this long")
	concurrency := fs.Int("concurrency", 1, "Envoy's --concurrency (worker threads, one VM each)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	type run struct{ name, wasm string }
	runs := []run{{"no filter", ""}}
	for _, a := range fs.Args() {
		name, path, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("bench start: arguments are name=module.wasm, got %s", a)
		}
		runs = append(runs, run{name, absPath(path)})
	}
	cpu := map[string][]float64{}
	wall := map[string][]float64{}
	for r := 0; r < *rounds; r++ {
		for _, ru := range runs {
			c, w, err := startOnce(ru.wasm, *concurrency, *timeout)
			if err != nil {
				return fmt.Errorf("bench start: %s: %w", ru.name, err)
			}
			fmt.Printf("round %d  %-16s cpu %6.2f s  wall %6.2f s\n", r+1, ru.name, c, w)
			cpu[ru.name] = append(cpu[ru.name], c)
			wall[ru.name] = append(wall[ru.name], w)
		}
	}
	fmt.Printf("\nmedians over %d rounds (load average at the end: %s)\n", *rounds, loadAvg())
	fmt.Println("| configuration | CPU s (median) | wall s (median) | CPU s per round |")
	fmt.Println("|---|---|---|---|")
	for _, ru := range runs {
		var each []string
		for _, c := range cpu[ru.name] {
			each = append(each, strconv.FormatFloat(c, 'f', 2, 64))
		}
		fmt.Printf("| %s | %.2f | %.2f | %s |\n", ru.name, spreadOf(cpu[ru.name]).Median, spreadOf(wall[ru.name]).Median, strings.Join(each, ", "))
	}
	return nil
}

// startOnce runs Envoy once through the project's launcher (func-e) and
// returns its CPU and wall seconds until the listener's first 200.
func startOnce(wasm string, concurrency int, timeout time.Duration) (cpuSec, wall float64, err error) {
	t0 := time.Now()
	p, err := envoy.Spawn(envoy.Options{
		NoWasm: wasm == "", PluginWasm: wasm, PluginConfig: startConfig,
		Concurrency: concurrency, LogLevel: "error",
	})
	if err != nil {
		return 0, 0, err
	}
	defer p.Stop()
	client := &http.Client{Timeout: time.Second}
	for time.Since(t0) < timeout {
		if resp, err := client.Get(p.URL("/")); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				wall = time.Since(t0).Seconds()
				pid, err := p.PID()
				if err != nil {
					return 0, 0, err
				}
				cpuSec, err = cpuSeconds(pid)
				return cpuSec, wall, err
			}
		}
		if p.Exited() {
			return 0, 0, fmt.Errorf("envoy exited:\n%s", envoy.Tail(p.Log(), 20))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0, 0, fmt.Errorf("no 200 on %s within %v", p.URL("/"), timeout)
}
