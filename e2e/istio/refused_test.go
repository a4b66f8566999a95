package istio

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"istio.io/istio/pkg/config/schema/gvk"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// refusedRule is what the plugin refuses: a burst below the rate.
const refusedReason = "refusing to start: config: rules[2].algorithm_config.burst: must be >= tokens_per_second (2), got 1"

// refusedGateway is the example's gateway WasmPlugin with failStrategy
// strategy and a pluginConfig the plugin refuses (anonymous-per-ip's burst
// below its rate).
func refusedGateway(t *testing.T, wasm string, port int, strategy string) string {
	t.Helper()
	return wasmPlugin(t, gatewayExample, wasm, port, func(spec map[string]any) {
		gatewayPluginEdit(t)(spec)
		spec["failStrategy"] = strategy
		rules := spec["pluginConfig"].(map[string]any)["rules"].([]any)
		rule := rules[2].(map[string]any)
		if rule["name"] != "anonymous-per-ip" {
			t.Fatalf("rules[2] of %s is %v, want anonymous-per-ip", gatewayExample, rule["name"])
		}
		rule["algorithm_config"].(map[string]any)["burst"] = 1
	})
}

// ecdsStat sums the counters name of every ECDS subscription of Envoy
// (extension_config_discovery.<prefix>.<resource>.<name>).
func ecdsStat(t *testing.T, e *envoytest.Envoy, name string) uint64 {
	t.Helper()
	var sum uint64
	for k, v := range e.Stats() {
		if strings.HasPrefix(k, "extension_config_discovery.") && strings.HasSuffix(k, "."+name) {
			sum += v
		}
	}
	return sum
}

// enforcesExample checks that the gateway still applies the example's
// anonymous-per-ip rule (burst 10) to a new client src.
func enforcesExample(t *testing.T, e *envoytest.Envoy, src string) {
	t.Helper()
	c := newSourceClient(t, e, src)
	start := time.Now()
	var statuses []int
	ok := 0
	for range anonBurst + 4 {
		st, h := c.get("/public", nil)
		statuses = append(statuses, st)
		switch {
		case st == 200:
			ok++
		case st == 429 && strings.HasPrefix(h.Get("RateLimit-Policy"), `"anonymous-per-ip";q=10;`):
		default:
			t.Fatalf("%s: statuses %v, policy %q: want 200, or 429 from the example's anonymous-per-ip", src, statuses, h.Get("RateLimit-Policy"))
		}
	}
	if refill := refillBound(anonRate, time.Since(start)); ok < anonBurst || ok > anonBurst+refill {
		t.Fatalf("%s: statuses %v: want %d (+ at most %d refilled) 200s, then 429", src, statuses, anonBurst, refill)
	}
}

// allFail sends n requests from a new client src and checks that Envoy
// answers each with 500: its answer for an HTTP filter whose configuration
// it never accepted. (A working plugin before that filter still decides
// and adds its RateLimit headers to the 500.)
func allFail(t *testing.T, e *envoytest.Envoy, src string, n int) {
	t.Helper()
	c := newSourceClient(t, e, src)
	for i := range n {
		if st, h := c.get("/public", nil); st != 500 {
			t.Fatalf("%s: request %d: %d %v, want 500 from Envoy", src, i, st, h)
		}
	}
}

// waitRefused waits until Envoy has refused one more ECDS resource than
// before and the plugin has said why.
func waitRefused(t *testing.T, e *envoytest.Envoy, before uint64) {
	t.Helper()
	waitUntil(t, "Envoy refusing the ECDS resource", 60*time.Second, func() bool {
		return ecdsStat(t, e, "config_fail") > before
	})
	e.WaitLog(refusedReason, 10*time.Second)
}

// TestIstioRefusedConfig: a pluginConfig the plugin refuses, pushed by
// Istio, with either failStrategy. The plugin refuses to configure, so
// Envoy cannot build the filter configuration and refuses (NACKs) the ECDS
// resource whatever failure_policy says; Istio logs the NACK and changes
// nothing. What the gateway then does depends on whether Envoy had an
// accepted configuration for that filter before.
func TestIstioRefusedConfig(t *testing.T) {
	src := 10
	next := func() string { src++; return "127.0.0." + strconv.Itoa(src) }
	for _, strategy := range []string{"FAIL_OPEN", "FAIL_CLOSE"} {
		t.Run("update of a running WasmPlugin keeps the previous configuration, "+strategy, func(t *testing.T) {
			g := startGatewaySetup(t)
			e := g.envoy
			g.mesh.apply(t, refusedGateway(t, g.wasm, e.ListenerPort(), strategy))
			waitRefused(t, e, 0)
			enforcesExample(t, e, next())

			// Fixed in the WasmPlugin: accepted, new VMs, still enforcing.
			reloads := ecdsStat(t, e, "config_reload")
			g.mesh.apply(t, wasmPlugin(t, gatewayExample, g.wasm, e.ListenerPort(), gatewayPluginEdit(t)))
			waitUntil(t, "Envoy taking the fixed configuration", 60*time.Second, func() bool {
				return ecdsStat(t, e, "config_reload") > reloads
			})
			enforcesExample(t, e, next())
		})

		t.Run("a new WasmPlugin makes every request fail, "+strategy, func(t *testing.T) {
			g := startGatewaySetup(t)
			e := g.envoy
			enforcesExample(t, e, next())
			bad := tenantPlugin(strategy, `{"rules": [{"name": "tenant", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 2, "burst": 1}}]}`)
			g.mesh.apply(t, bad(g.wasm, e.ListenerPort()))
			waitUntil(t, "Envoy refusing the new plugin's ECDS resource", 60*time.Second, func() bool {
				return ecdsStat(t, e, "config_fail") > 0
			})
			e.WaitLog("refusing to start: config: rules[0].algorithm_config.burst", 10*time.Second)
			// Istio sent the listener with the new filter and Envoy took it
			// (nothing left to wait for once the ECDS resource failed): the
			// filter has no configuration, and Envoy answers 500.
			waitUntil(t, "the listener with the new filter", 60*time.Second, func() bool {
				return index(httpFilters(t, e), "extensions.istio.io/trafficextension/"+istioName("istio-system", "tenants")) >= 0
			})
			allFail(t, e, next(), 5)

			// Removing the WasmPlugin restores the gateway.
			if err := g.mesh.ds.Store().Delete(gvk.WasmPlugin, "tenants", "istio-system", nil); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the listener without the refused filter", 60*time.Second, func() bool {
				return index(httpFilters(t, e), "extensions.istio.io/trafficextension/"+istioName("istio-system", "tenants")) < 0
			})
			enforcesExample(t, e, next())
		})

		t.Run("a gateway that starts with it fails every request, "+strategy, func(t *testing.T) {
			wasm := pluginCopy(t)
			up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
			port := envoytest.FreePort(t)
			m := startMesh(t, meshObjects{GatewayPort: port, UpstreamPort: up.Port(), LimitdPort: envoytest.FreePort(t),
				Configs: []string{refusedGateway(t, wasm, port, strategy)}})
			// Envoy becomes ready and its listener accepts connections: the
			// failed ECDS fetch does not hold the listener back.
			e := m.startGateway(t)
			e.WaitLog(refusedReason, 10*time.Second)
			allFail(t, e, next(), 5)

			// Fixed in the WasmPlugin: the gateway serves and enforces.
			m.apply(t, wasmPlugin(t, gatewayExample, wasm, port, gatewayPluginEdit(t)))
			waitUntil(t, "the gateway serving", 60*time.Second, func() bool {
				st, _ := newSourceClient(t, e, "127.0.0.99").get("/healthz", nil)
				return st == 200
			})
			enforcesExample(t, e, next())
		})
	}
}
