// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// Idle CPU after many listener updates. Envoy keeps a replaced listener
// configuration, and the plugin's configuration in it, while its
// connections drain: up to --drain-time-s (600 s by default). These
// figures are how much of a CPU an idle Envoy uses while idleUpdates
// replaced configurations are kept.
const (
	idleUpdates = 1000
	// idleSettle passes after the last update before the window starts, so
	// the window sees no update's work; idleWindow is the window.
	idleSettle = 5 * time.Second
	idleWindow = 30 * time.Second
)

// TestIdleCPUAfterListenerUpdates pushes idleUpdates listener updates
// (through the watched listener file, each a new plugin configuration,
// each answering one request on a new connection, so every configuration
// has a worker) to a real Envoy with each build, then measures Envoy's CPU
// time (/proc/<pid>/stat) over idleWindow with no traffic, while the
// replaced configurations drain. The native module must use no more than
// the Wasm plugin measured in the same run, within a generous margin that
// a loaded machine cannot exhaust: 2× the Wasm plugin's share plus 2% of a
// CPU. A tick per configuration (a goroutine, a main-thread dispatch and a
// stop-the-world memory read each second, for each) used 13–15% of a CPU
// there. `make bench-idle` prints the figures.
func TestIdleCPUAfterListenerUpdates(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the listener updates take minutes")
	}
	share := map[envoytest.Build]float64{}
	for _, b := range envoytest.Builds {
		t.Run(b.String(), func(t *testing.T) { share[b] = idleCPU(t, b) })
	}
	wasm, okW := share[envoytest.Wasm]
	native, okN := share[envoytest.Native]
	if !okW || !okN || t.Failed() {
		return
	}
	limit := 2*wasm + 0.02
	t.Logf("idle CPU after %d listener updates: native %.2f%% of a CPU, wasm %.2f%% (bound for native: %.2f%%)",
		idleUpdates, 100*native, 100*wasm, 100*limit)
	if native > limit {
		t.Errorf("the idle native Envoy uses %.2f%% of a CPU after %d listener updates, over 2× the Wasm plugin's (%.2f%%) + 2%%",
			100*native, idleUpdates, 100*wasm)
	}
}

// idleCPU returns the share of one CPU an idle Envoy with build uses after
// idleUpdates listener updates.
func idleCPU(t *testing.T, build envoytest.Build) float64 {
	config := func(v int) string {
		return fmt.Sprintf(`{"rules": [{"name": "idle-%d", "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1000, "burst": 1000}}]}`, v)
	}
	e := envoytest.Start(t, envoytest.Options{Build: build, LDS: true, PluginConfig: config(1), Concurrency: 2})
	e.WaitStat("listener_manager.total_listeners_active", 1, 60*time.Second)
	start := time.Now()
	for v := 2; v <= idleUpdates+1; v++ {
		accepted := e.Stat("listener_manager.lds.update_success") + 1
		e.WriteLDS(fmt.Sprint(v), config(v))
		e.WaitStat("listener_manager.lds.update_success", accepted, 60*time.Second)
		c := e.Client()
		res := c.Get("/", map[string]string{"x-user": "idle"})
		c.Close()
		if res.Status != http.StatusOK {
			t.Fatalf("update %d: GET / = %v", v-1, res)
		}
	}
	if n := e.Stat("listener_manager.lds.update_rejected"); n != 0 {
		t.Fatalf("Envoy rejected %d listener updates", n)
	}
	draining := e.Stat("listener_manager.total_filter_chains_draining")
	t.Logf("%d listener updates in %v; filter chains draining: %d", idleUpdates, time.Since(start).Round(time.Second), draining)
	if draining < idleUpdates/2 {
		t.Fatalf("only %d filter chains drain after %d updates: the replaced configurations are not kept", draining, idleUpdates)
	}
	time.Sleep(idleSettle) // lets the updates' work end: nothing is measured yet
	cpu0, t0 := e.CPUTime(), time.Now()
	time.Sleep(idleWindow) // the measuring window
	cpu1, t1 := e.CPUTime(), time.Now()
	share := float64(cpu1-cpu0) / float64(t1.Sub(t0))
	t.Logf("%s: idle Envoy's CPU over %v: %v, %.2f%% of a CPU (%d filter chains draining)",
		build, t1.Sub(t0).Round(time.Millisecond), cpu1-cpu0, 100*share, e.Stat("listener_manager.total_filter_chains_draining"))
	return share
}
