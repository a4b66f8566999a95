// Command startcost measures what Envoy spends from its start until its
// listener first answers 200, with --concurrency 1 (-concurrency): the process's CPU time
// (utime + stime from /proc/<pid>/stat, all threads) and the wall time. It
// runs each module given (and Envoy with no filter) in turn, round after
// round, so that a change in the machine's load touches all of them alike.
// `make bench-start` runs it; docs/benchmarks/footprint.md has its figures.
//
//	go run ./internal/footprint/startcost -envoy build/venv/bin/envoy \
//	    -rounds 3 floor=build/footprint/floor.wasm plugin=build/plugin.wasm
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// config is the plugin's demo rule (envoy.yaml); a module other than the
// plugin ignores it.
const config = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 5}}]}`

func main() {
	envoy := flag.String("envoy", "build/venv/bin/envoy", "the Envoy binary")
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
	dir, err := os.MkdirTemp("", "startcost")
	if err != nil {
		fail(err.Error())
	}
	defer os.RemoveAll(dir)
	cpu := map[string][]float64{}
	wall := map[string][]float64{}
	for r := 0; r < *rounds; r++ {
		for _, ru := range runs {
			c, w, err := start(*envoy, dir, ru.wasm, *concurrency, *timeout)
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

// start runs Envoy once and returns its CPU and wall seconds until the
// listener's first 200.
func start(envoy, dir, wasm string, concurrency int, timeout time.Duration) (cpu, wall float64, err error) {
	port, err := freePort()
	if err != nil {
		return 0, 0, err
	}
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, []byte(bootstrap(port, wasm)), 0o644); err != nil {
		return 0, 0, err
	}
	cmd := exec.Command(envoy, "-c", cfg, "--concurrency", strconv.Itoa(concurrency), "--disable-hot-restart", "--log-level", "error")
	cmd.Stderr = os.Stderr
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/"
	client := &http.Client{Timeout: time.Second}
	for time.Since(t0) < timeout {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				wall = time.Since(t0).Seconds()
				cpu, err := cpuSeconds(cmd.Process.Pid)
				return cpu, wall, err
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0, 0, fmt.Errorf("no 200 on %s within %v", url, timeout)
}

// cpuSeconds is utime + stime of pid (all its threads), in seconds.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may hold spaces) start at state.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("cannot read %s", b)
	}
	return (utime + stime) / clockTicks, nil
}

// clockTicks is sysconf(_SC_CLK_TCK), 100 on Linux.
const clockTicks = 100

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func bootstrap(port int, wasm string) string {
	filter := ""
	if wasm != "" {
		filter = `
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: tokenbucket
                root_id: tokenbucket
                fail_open: false
                vm_config:
                  vm_id: tokenbucket
                  runtime: envoy.wasm.runtime.v8
                  code: { local: { filename: ` + strconv.Quote(wasm) + ` } }
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: ` + strconv.Quote(config)
	}
	return `static_resources:
  listeners:
  - name: start
    address:
      socket_address: { address: 127.0.0.1, port_value: ` + strconv.Itoa(port) + ` }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: start
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                direct_response: { status: 200 }
          http_filters:` + filter + `
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "startcost:", msg)
	os.Exit(1)
}
