// Command startcost measures what Envoy spends from its start until its
// listener first answers 200, with --concurrency 1 (-concurrency): the process's CPU time
// (user + system, all threads) and the wall time. It
// runs each module given (and Envoy with no filter) in turn, round after
// round, so that a change in the machine's load touches all of them alike.
// `make bench-start` runs it; docs/benchmarks/footprint.md has its figures.
//
//	go run ./internal/footprint/startcost -rounds 3 \
//	    floor=build/footprint/floor.wasm plugin=build/plugin.wasm
//
// Envoy is started by the project's launcher (internal/envoy, func-e), with
// its bootstrap: a listener whose route answers 200 directly.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shirou/gopsutil/v4/process"

	"github.com/ratelimit-wasm/tokenbucket/internal/envoy"
)

// config is the plugin's demo rule (envoy.yaml); a module other than the
// plugin ignores it.
const config = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 5}}]}`

func main() {
	rounds := flag.Int("rounds", 3, "rounds (each runs every configuration once)")
	timeout := flag.Duration("timeout", 60*time.Second, "give up on one start after this long")
	concurrency := flag.Int("concurrency", 1, "Envoy's --concurrency (worker threads, one VM each)")
	flag.Parse()
	type run struct{ name, wasm string }
	runs := []run{{"no filter", ""}}
	for _, a := range flag.Args() {
		name, path, ok := strings.Cut(a, "=")
		if !ok {
			fail("arguments are name=module.wasm, got " + a)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			fail(err.Error())
		}
		runs = append(runs, run{name, abs})
	}
	cpu := map[string][]float64{}
	wall := map[string][]float64{}
	for r := 0; r < *rounds; r++ {
		for _, ru := range runs {
			c, w, err := start(ru.wasm, *concurrency, *timeout)
			if err != nil {
				fail(ru.name + ": " + err.Error())
			}
			fmt.Printf("round %d  %-16s cpu %6.2f s  wall %6.2f s\n", r+1, ru.name, c, w)
			cpu[ru.name] = append(cpu[ru.name], c)
			wall[ru.name] = append(wall[ru.name], w)
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("\nmedians over %d rounds (load average at the end: %s)\n", *rounds, strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Println("| configuration | CPU s (median) | wall s (median) | CPU s per round |")
	fmt.Println("|---|---|---|---|")
	for _, ru := range runs {
		var each []string
		for _, c := range cpu[ru.name] {
			each = append(each, strconv.FormatFloat(c, 'f', 2, 64))
		}
		fmt.Printf("| %s | %.2f | %.2f | %s |\n", ru.name, median(cpu[ru.name]), median(wall[ru.name]), strings.Join(each, ", "))
	}
}

// start runs Envoy once through the project's launcher (func-e) and returns
// its CPU and wall seconds until the listener's first 200.
func start(wasm string, concurrency int, timeout time.Duration) (cpuSec, wall float64, err error) {
	t0 := time.Now()
	p, err := envoy.Spawn(envoy.Options{
		NoWasm: wasm == "", PluginWasm: wasm, PluginConfig: config,
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
				proc, err := process.NewProcess(int32(pid))
				if err != nil {
					return 0, 0, err
				}
				t, err := proc.Times()
				if err != nil {
					return 0, 0, err
				}
				return t.User + t.System, wall, nil
			}
		}
		if p.Exited() {
			return 0, 0, fmt.Errorf("envoy exited:\n%s", envoy.Tail(p.Log(), 20))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0, 0, fmt.Errorf("no 200 on %s within %v", p.URL("/"), timeout)
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "startcost:", msg)
	os.Exit(1)
}
