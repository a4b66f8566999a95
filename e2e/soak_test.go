// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
)

// TestSoakVersions runs the plugin through a bounded garbage-collection soak
// on each Envoy binary of SOAK_ENVOYS ("1.37.0=path/to/envoy 1.40.0=..."),
// for `make soak-versions`; without it the test skips (CI does not run it).
// Each Envoy gets the demo configuration at --concurrency 2, with the
// guest's GOGC set to each value of SOAK_GOGC (default "100 10": Go's
// default, and a collection every 10% of heap growth, for many more
// collections), and SOAK_REQUESTS requests (default 40000) from 4 loopback
// clients over 500 keys (allowed requests and 429s with their JSON body),
// so the Go runtime in each worker allocates and collects; the test
// then reads wasmcustom.tokenbucket.memory.gc_cycles (the collections of all
// workers, reported once a second) and checks that Envoy is alive, that no
// request failed or got a 5xx, and that the log has no Go runtime fatal
// error. A table of what was measured goes to SOAK_OUT (default
// ../build/soak/results.md).
//
// Wasm only: it soaks the Go runtime inside the Wasm VMs (the host's poll_oneoff) on each Envoy release.
//
// Serial: it sets ENVOY_BIN in the process's environment (t.Setenv) for each
// release it soaks; it runs only under make soak-versions.
func TestSoakVersions(t *testing.T) {
	releases := envoyReleases(t, "SOAK_ENVOYS", "soak-versions")
	wasm := envoytest.PluginWasm(t)
	requests := 40000
	if s := os.Getenv("SOAK_REQUESTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1000 || n > 1000000 {
			t.Fatalf("SOAK_REQUESTS %q: want 1000..1000000", s)
		}
		requests = n
	}
	gogcs := strings.Fields(os.Getenv("SOAK_GOGC"))
	if len(gogcs) == 0 {
		gogcs = []string{"100", "10"}
	}
	var rows []string
	for _, r := range releases {
		for _, gogc := range gogcs {
			if n, err := strconv.Atoi(gogc); err != nil || n < 1 {
				t.Fatalf("SOAK_GOGC %q: want positive integers", gogc)
			}
			t.Run(r.version+"/GOGC="+gogc, func(t *testing.T) {
				rows = append(rows, soakOne(t, r.version, r.bin, wasm, gogc, requests))
			})
		}
	}
	sort.Strings(rows)
	table := "| Envoy | `envoy --version` | GOGC | requests | statuses | gc_cycles | Go fatal error in log | Envoy alive |\n" +
		"|---|---|---:|---:|---|---:|---|---|\n" + strings.Join(rows, "\n") + "\n"
	writeReleaseTable(t, "SOAK_OUT", filepath.Join("soak", "results.md"), table)
}

// soakOne soaks one Envoy binary and returns its row of the table.
func soakOne(t *testing.T, version, bin, wasm, gogc string, requests int) string {
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	v, err := exec.Command(abs, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", abs, err, v)
	}
	versionLine := strings.TrimSpace(string(v))
	if i := strings.LastIndex(versionLine, "version: "); i >= 0 {
		versionLine = versionLine[i+len("version: "):]
	}
	t.Setenv("ENVOY_BIN", abs)
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	const anchor = "                  vm_id: {{.VMID}}\n"
	if strings.Count(envoytest.DemoConfigYAML, anchor) != 1 {
		t.Fatalf("envoytest.DemoConfigYAML has changed: no single %q to add the guest's GOGC after", anchor)
	}
	cfg := strings.Replace(envoytest.DemoConfigYAML, anchor, anchor+
		"                  environment_variables:\n                    key_values: {GOGC: {{yamlstr .Data.gogc}}}\n", 1)
	e := envoytest.Start(t, envoytest.Options{
		Config: cfg, PluginWasm: wasm, PluginConfig: soakConfig, Data: map[string]any{"gogc": gogc},
		UpstreamPort: up.Port(), Concurrency: 2,
	})
	const clients, keys = 4, 500
	statuses := make([]map[int]int, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := e.Client()
			defer cl.Close()
			statuses[c] = map[int]int{}
			for i := c; i < requests; i += clients {
				r := cl.DoRequest(cl.NewRequest(http.MethodGet, "/", map[string]string{"x-api-key": "k" + strconv.Itoa(i%keys)}))
				if r.Err != nil {
					statuses[c][0]++
					continue
				}
				statuses[c][r.Status]++
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	total := map[int]int{}
	for _, s := range statuses {
		for k, n := range s {
			total[k] += n
		}
	}
	// The gauge is reported once a second by each worker's tick: wait for
	// two reports after the load, bounded.
	deadline := time.Now().Add(3 * time.Second)
	var gc uint64
	for time.Now().Before(deadline) {
		gc = e.Stat("wasmcustom.tokenbucket.memory.gc_cycles")
		time.Sleep(100 * time.Millisecond) // bounded wait for the next tick's report
	}
	log := e.Log()
	fatal := "no"
	for _, s := range []string{"fatal error", "poll_oneoff", "Function: proxy_on", "wasm trap"} {
		if strings.Contains(log, s) {
			fatal = fmt.Sprintf("yes (%q)", s)
		}
	}
	alive := "yes"
	if code, _ := httpGetStatus(e.AdminURL("/ready")); code != 200 {
		alive = fmt.Sprintf("no (/ready %d)", code)
	}
	var parts []string
	for _, k := range []int{0, 200, 429, 503} {
		if total[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d×%d", total[k], k))
		}
	}
	for k, n := range total {
		if k != 0 && k != 200 && k != 429 && k != 503 {
			parts = append(parts, fmt.Sprintf("%d×%d", n, k))
		}
	}
	t.Logf("Envoy %s, GOGC=%s: %d requests in %v, statuses %v, gc_cycles %d, fatal %s, alive %s",
		version, gogc, requests, elapsed.Round(time.Millisecond), total, gc, fatal, alive)
	if fatal != "no" || total[0] > 0 || total[503] > 0 || gc == 0 {
		t.Errorf("Envoy %s: the plugin did not come through the soak (fatal %s, %d errors, %d×503, %d GCs)\n%s",
			version, fatal, total[0], total[503], gc, logtext.Tail(log, 30))
	}
	return fmt.Sprintf("| %s | %s | %s | %d | %s | %d | %s | %s |", version, versionLine, gogc, requests, strings.Join(parts, ", "), gc, fatal, alive)
}

// soakConfig limits per key, so that the load keeps both answers coming:
// allowed requests and rejections with their JSON body.
const soakConfig = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 5}}]}`

func httpGetStatus(url string) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
