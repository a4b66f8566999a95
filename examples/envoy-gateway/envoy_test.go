package envoygateway

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// gatewayBootstrap is a bootstrap in the form Envoy Gateway v1.9.1's
// translator gives an EnvoyExtensionPolicy's dynamic module (read in
// internal/xds/translator/dynamicmodule.go; no exported package runs that
// translator):
//
//   - buildHCMDynamicModuleFilter: one HTTP filter per policy entry, named
//     envoy.filters.http.dynamic_modules/<policy>/dynamic-module/<index>,
//     disabled on the connection manager;
//   - dynamicModuleConfig: dynamic_module_config with no name, the
//     registry entry's do_not_close and load_globally, and the module as
//     module.local.filename (the entry's path, so no search path); its
//     filter_name, terminal_filter, and filter_config a StringValue of the
//     policy's config, its JSON text as it is;
//   - patchRoute: each route the policy targets enables the filter with a
//     typed_per_filter_config entry of that name holding an
//     envoy.config.route.v3.FilterConfig whose config is an empty Any.
//
// The route /free is one the policy does not target.
const gatewayBootstrap = `
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: {{.AdminPort}}}}
static_resources:
  listeners:
  - name: main
    address: {socket_address: {address: 127.0.0.1, port_value: {{.ListenerPort}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: /free}
                direct_response: {status: 200, body: {inline_string: "free\n"}}
              - match: {prefix: /}
                direct_response: {status: 200, body: {inline_string: "ok\n"}}
                typed_per_filter_config:
                  {{yamlstr .Data.filter}}:
                    "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig
                    config: {}
          http_filters:
          - name: {{yamlstr .Data.filter}}
            disabled: true
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
              dynamic_module_config:
                do_not_close: {{.Data.doNotClose}}
                load_globally: false
                module: {local: {filename: {{yamlstr .Data.path}}}}
              filter_name: {{yamlstr .Data.filterName}}
              terminal_filter: false
              filter_config:
                "@type": type.googleapis.com/google.protobuf.StringValue
                value: {{yamlstr .Data.config}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`

// gatewayOptions starts Envoy with the example's module filter in the form
// Envoy Gateway generates (gatewayBootstrap): the module's path where the
// EnvoyProxy registers it replaced by this checkout's libtokenbucket.so,
// and Envoy's environment holding godebug as GODEBUG and an empty folder
// as ENVOY_DYNAMIC_MODULES_SEARCH_PATH (so the module can only be found by
// its path).
func gatewayOptions(t *testing.T, m nativeModule, godebug string) envoytest.Options {
	t.Helper()
	return envoytest.Options{
		Config:      gatewayBootstrap,
		NoWasm:      true,
		Concurrency: 2,
		Data: map[string]any{
			"filter":     "envoy.filters.http.dynamic_modules/envoyextensionpolicy/default/tokenbucket/dynamic-module/0",
			"doNotClose": *m.entry.DoNotClose,
			"path":       envoytest.NativeModule(t),
			"filterName": *m.filter.FilterName,
			"config":     string(m.filter.Config.Raw),
		},
		Env: []string{"GODEBUG=" + godebug, "ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + t.TempDir()},
	}
}

// exampleModule is the example's one module filter.
func exampleModule(t *testing.T) nativeModule {
	t.Helper()
	mods, err := resolve(loadExample(t))
	if err != nil || len(mods) != 1 {
		t.Fatalf("resolve: %d filters, %v", len(mods), err)
	}
	return mods[0]
}

// TestGatewayShapeOnEnvoy: with the EnvoyProxy's GODEBUG, the module loads
// by its path, takes the configuration as Envoy Gateway passes it, runs on
// the route that enables it (the demo rule: a burst of 5 per x-api-key,
// then 429) and not on the other, and counts under the usual names although
// dynamic_module_config has no name.
func TestGatewayShapeOnEnvoy(t *testing.T) {
	m := exampleModule(t)
	var godebug string
	for _, v := range m.proxy.Spec.Provider.Kubernetes.EnvoyDeployment.Container.Env {
		if v.Name == "GODEBUG" {
			godebug = v.Value
		}
	}
	e := envoytest.Start(t, gatewayOptions(t, m, godebug))
	c := e.Client()
	t.Cleanup(c.Close)
	const burst = 5 // the demo rule: 0.02 tokens a second, so none refill during the test
	key := map[string]string{"x-api-key": "a"}
	for i := range burst {
		if r := c.Get("/", key); r.Status != 200 {
			t.Fatalf("request %d: %v, want 200", i+1, r)
		}
	}
	if r := c.Get("/", key); r.Status != 429 || r.Header.Get("Retry-After") == "" {
		t.Fatalf("request %d: %v, want 429 with Retry-After", burst+1, r)
	}
	// The key's tokens are spent: a request the module saw would be refused.
	for i := range 2 * burst {
		if r := c.Get("/free", key); r.Status != 200 {
			t.Fatalf("/free request %d: %v, want 200 (the filter is off there)", i+1, r)
		}
	}
	// The module's counters under their usual names: Envoy's prefix for
	// dynamic modules, then the names the module defines.
	prefix := envoytest.Native.StatPrefix() + "tokenbucket.rule.per-key."
	e.WaitStat(prefix+"allowed", burst, 5*time.Second)
	e.WaitStat(prefix+"rejected", 1, 5*time.Second)
}

// TestGatewayShapeWithoutGODEBUG: the same Envoy without the EnvoyProxy's
// GODEBUG refuses the listener at start, and the module's log line says
// what to set.
func TestGatewayShapeWithoutGODEBUG(t *testing.T) {
	f := envoytest.ExpectStartFailure(t, gatewayOptions(t, exampleModule(t), ""))
	if !strings.Contains(f.Log, "GODEBUG=cgocheck=0") {
		t.Fatalf("envoy refused to start (%v) without a log line naming GODEBUG=cgocheck=0:\n%s", f, f.Log)
	}
}
