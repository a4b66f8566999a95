// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package idlecpu

import (
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// Idle CPU after many listener updates. Envoy keeps a replaced listener
// configuration, and the plugin's configuration in it, while its
// connections drain: up to --drain-time-s (600 s by default; here an hour,
// so that none is dropped before the window ends). These figures are how
// much of a CPU an idle Envoy uses while idleUpdates replaced
// configurations are kept.
const (
	idleUpdates = 1000
	// idleSettle passes after the last update before the window starts, so
	// the window sees no update's work; idleWindow is the window.
	idleSettle = 5 * time.Second
	idleWindow = 30 * time.Second
	// idleMargin is how much more of a CPU than the Wasm plugin's Envoy the
	// native module's may use.
	idleMargin = 0.01
)

// TestIdleCPUAfterListenerUpdates pushes idleUpdates listener updates
// (through the watched listener file, each a new plugin configuration,
// each answering one request on a new connection, so that every
// configuration has a worker) to two real Envoys, one with each build, in
// turn, then measures both Envoys' CPU time (/proc/<pid>/stat) over the
// same idleWindow with no traffic, while the replaced configurations are
// kept. The idle native Envoy must use no more of a CPU than the Wasm
// plugin's, give or take idleMargin: measured side by side, both see the
// same load. With a tick per configuration (a goroutine, a main-thread
// dispatch and a stop-the-world memory read each second, for each), the
// native Envoy used twice the Wasm plugin's CPU or more. A measurement, so
// it runs only from `make bench-idle` (IDLE_CPU=1), which prints the
// figures; native/filter's TestConfigurationsShareOneTicker holds the
// mechanism in `make test`.
func TestIdleCPUAfterListenerUpdates(t *testing.T) {
	if os.Getenv("IDLE_CPU") == "" {
		t.Skip("set IDLE_CPU=1 (make bench-idle) to measure an idle Envoy's CPU")
	}
	config := func(v int) string {
		return fmt.Sprintf(`{"rules": [{"name": "idle-%d", "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1000, "burst": 1000}}]}`, v)
	}
	envs := map[envoytest.Build]*envoytest.Envoy{}
	for _, b := range envoytest.Builds {
		envs[b] = envoytest.Start(t, envoytest.Options{Build: b, LDS: true, PluginConfig: config(1), Concurrency: 2,
			ExtraArgs: []string{"--drain-time-s", "3600"}})
		envs[b].WaitStat("listener_manager.total_listeners_active", 1, 60*time.Second)
	}
	start := time.Now()
	for v := 2; v <= idleUpdates+1; v++ {
		for _, b := range envoytest.Builds {
			e := envs[b]
			accepted := e.Stat("listener_manager.lds.update_success") + 1
			e.WriteLDS(fmt.Sprint(v), config(v))
			e.WaitStat("listener_manager.lds.update_success", accepted, 60*time.Second)
			c := e.Client()
			res := c.Get("/", map[string]string{"x-user": "idle"})
			c.Close()
			if res.Status != http.StatusOK {
				t.Fatalf("%s, update %d: GET / = %v", b, v-1, res)
			}
		}
	}
	draining := func(b envoytest.Build) uint64 {
		return envs[b].Stat("listener_manager.total_filter_chains_draining")
	}
	for _, b := range envoytest.Builds {
		if n := envs[b].Stat("listener_manager.lds.update_rejected"); n != 0 {
			t.Fatalf("%s: Envoy rejected %d listener updates", b, n)
		}
		if n := draining(b); n != idleUpdates {
			t.Fatalf("%s: %d filter chains drain after %d updates, want every replaced one", b, n, idleUpdates)
		}
	}
	t.Logf("%d listener updates to each Envoy in %v", idleUpdates, time.Since(start).Round(time.Second))

	time.Sleep(idleSettle) // lets the updates' work end: nothing is measured yet
	cpu0, t0 := map[envoytest.Build]time.Duration{}, time.Now()
	for _, b := range envoytest.Builds {
		cpu0[b] = envs[b].CPU()
	}
	time.Sleep(idleWindow) // the measuring window: both Envoys idle
	share := map[envoytest.Build]float64{}
	for _, b := range envoytest.Builds {
		used := envs[b].CPU() - cpu0[b]
		share[b] = float64(used) / float64(time.Since(t0))
		t.Logf("%s: idle Envoy's CPU over %v with %d replaced configurations kept: %v, %.2f%% of a CPU",
			b, time.Since(t0).Round(time.Second), draining(b), used, 100*share[b])
	}
	native, wasm := share[envoytest.Native], share[envoytest.Wasm]
	if native > wasm+idleMargin {
		t.Errorf("the idle native Envoy uses %.2f%% of a CPU after %d listener updates, more than the Wasm plugin's %.2f%% + %.0f%%",
			100*native, idleUpdates, 100*wasm, 100*idleMargin)
	}
}
