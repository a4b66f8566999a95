// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/engine"
)

const (
	good = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 50}}]}`
	bad  = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 5}}]}`
	// badLine is what the plugin logs for bad.
	badLine = "tokenbucket: invalid configuration, refusing to start: config: rules[0].algorithm_config.burst: must be >= tokens_per_second (10), got 5"
)

// bootstrap is an Envoy bootstrap with one Wasm filter whose configuration
// is the StringValue cfg.
func bootstrap(cfg string) string {
	return withFilters(`          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: tokenbucket
                vm_config: { runtime: envoy.wasm.runtime.v8, code: { local: { filename: plugin.wasm } } }
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: |
                    ` + cfg + `
`)
}

// withFilters is an Envoy bootstrap whose listener has the HTTP filters
// filters (YAML list items, indented as they stand) and the router.
func withFilters(filters string) string {
	return `static_resources:
  listeners:
  - name: l
    address: { socket_address: { address: 127.0.0.1, port_value: 10000 } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: l
          http_filters:
` + filters + `          - name: envoy.filters.http.router
`
}

func wasmPlugin(t *testing.T, old, new string) string {
	t.Helper()
	b, err := os.ReadFile("../../examples/istio/wasmplugin-gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("wasmplugin-gateway.yaml has no %q", old)
	}
	return string(bytes.Replace(b, []byte(old), []byte(new), 1))
}

func TestCheck(t *testing.T) {
	demo, err := os.ReadFile("../../envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bytesValue := strings.Replace(strings.Replace(bootstrap(good), "StringValue", "BytesValue", 1),
		"value: |\n                    "+good, "value: "+base64.StdEncoding.EncodeToString([]byte(good)), 1)
	for _, tt := range []struct {
		name, file, in string
		code           int
		want           []string // lines, in order
	}{
		{name: "json", file: "c.json", in: good, want: []string{"ok   c.json"}},
		{name: "json refused", file: "c.json", in: bad, code: 1, want: []string{"FAIL c.json: " + badLine}},
		{name: "json invalid", file: "c.json", in: `{"rules": [`, code: 1,
			want: []string{"FAIL c.json: tokenbucket: invalid configuration, refusing to start: config: invalid JSON: unexpected end of JSON input (at byte 11)"}},
		{name: "demo bootstrap", file: "envoy.yaml", in: string(demo), want: []string{`ok   envoy.yaml (document 0, Wasm plugin "tokenbucket" at static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config)`}},
		{name: "bootstrap refused", file: "e.yml", in: bootstrap(bad), code: 1,
			want: []string{`FAIL e.yml (document 0, Wasm plugin "tokenbucket" at static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config): ` + badLine}},
		{name: "bootstrap BytesValue", file: "e.yaml", in: bytesValue, want: []string{`ok   e.yaml (document 0, Wasm plugin "tokenbucket" at static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config)`}},
		{name: "bootstrap with no configuration", file: "e.yaml", in: strings.Split(bootstrap(good), "                configuration:")[0], code: 1,
			want: []string{`FAIL e.yaml (document 0, Wasm plugin "tokenbucket" at static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config): tokenbucket: invalid configuration, refusing to start: config: invalid JSON: unexpected end of JSON input (at byte 0)`}},
		{name: "bootstrap Struct configuration", file: "e.yaml", in: strings.Replace(bootstrap(good), "google.protobuf.StringValue", "google.protobuf.Struct", 1), code: 2,
			want: []string{`FAIL e.yaml: document 0: .static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.configuration: @type "type.googleapis.com/google.protobuf.Struct": the plugin reads its JSON from a type.googleapis.com/google.protobuf.StringValue (or BytesValue)`}},
		{name: "WasmPlugin", file: "w.yaml", in: wasmPlugin(t, "", ""), want: []string{"ok   w.yaml (document 0, WasmPlugin istio-system/ratelimit spec.pluginConfig)"}},
		{name: "WasmPlugin refused", file: "w.yaml", in: wasmPlugin(t, "burst: 4000", "burst: 20000000000"), code: 1,
			want: []string{"FAIL w.yaml (document 0, WasmPlugin istio-system/ratelimit spec.pluginConfig): tokenbucket: invalid configuration, refusing to start: config: rules[3].algorithm_config.burst: must be at most 1000000000 for a cluster rule (the limit service's bound), got 20000000000"}},
		{name: "WasmPlugin misspelt field", file: "w.yaml", in: wasmPlugin(t, "pluginConfig:", "plugin_config:"), code: 2,
			want: []string{`FAIL w.yaml: document 0: spec.plugin_config: unknown field: the CRD schema knows only the camelCase name "pluginConfig"`}},
		{name: "two documents", file: "m.yaml", in: wasmPlugin(t, "", "") + "\n---\n" + bootstrap(bad), code: 1,
			want: []string{"ok   m.yaml (document 0, WasmPlugin istio-system/ratelimit spec.pluginConfig)",
				`FAIL m.yaml (document 1, Wasm plugin "tokenbucket" at static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config): ` + badLine}},
		{name: "no plugin", file: "n.yaml", in: "admin: {}\n", code: 1, want: []string{"FAIL n.yaml: no plugin configuration (no WasmPlugin, no Wasm filter with vm_config, no dynamic module filter with filter_name tokenbucket, no EnvoyExtensionPolicy dynamicModule with filterName tokenbucket)"}},
		{name: "other extension", file: "c.txt", in: good, code: 2, want: []string{"FAIL c.txt: checkconfig: c.txt: want a .json, .yaml or .yml file"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, tt.file)
			if err := os.WriteFile(path, []byte(tt.in), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Chdir(dir)
			var out, errOut bytes.Buffer
			code := run([]string{tt.file}, strings.NewReader(""), &out, &errOut)
			got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			if code != tt.code || strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("exit %d, want %d; output:\n%s\nwant:\n%s\n%s", code, tt.code, out.String(), strings.Join(tt.want, "\n"), errOut.String())
			}
		})
	}
}

// TestStdin: - reads the configuration from standard input.
func TestStdin(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"-"}, strings.NewReader(bad), &out, &out); code != 1 || out.String() != "FAIL -: "+badLine+"\n" {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
}

// TestLineIsThePlugins: the line printed after "FAIL <where>: " is the
// plugin's own refusal (engine.CheckConfiguration, whose text
// plugin.TestCheckConfigurationIsTheLoggedLine pins to OnPluginStart's
// critical log; e2e's TestCheckConfigMatchesEnvoy to Envoy's).
func TestLineIsThePlugins(t *testing.T) {
	want := engine.CheckConfiguration([]byte(bad))
	if want == nil || want.Error() != badLine {
		t.Fatalf("engine.CheckConfiguration = %v, want %q", want, badLine)
	}
}

func TestUsage(t *testing.T) {
	var out bytes.Buffer
	if code := run(nil, strings.NewReader(""), &out, &out); code != 2 {
		t.Fatalf("no arguments: exit %d, want 2", code)
	}
}

// TestDemoCommentSaysItsRule: the header of envoy.yaml (the demo) states the
// burst and refill rate of the rule it configures. (It said 1/s for a rule
// of 0.02/s.)
func TestDemoCommentSaysItsRule(t *testing.T) {
	b, err := os.ReadFile("../../envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	found, err := fromYAML(b)
	if err != nil || len(found) != 1 {
		t.Fatalf("envoy.yaml: %d configurations, %v; want one", len(found), err)
	}
	cfg, err := config.Parse(found[0].data)
	if err != nil || len(cfg.Rules) != 1 {
		t.Fatalf("envoy.yaml's configuration: %v", err)
	}
	l := cfg.Rules[0].Limit
	want := fmt.Sprintf("a bucket of %s tokens refilled at %s/s",
		strconv.FormatFloat(l.Burst, 'f', -1, 64), strconv.FormatFloat(l.TokensPerSecond, 'f', -1, 64))
	var header strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		c, ok := strings.CutPrefix(line, "# ")
		if !ok {
			break
		}
		header.WriteString(c + " ")
	}
	if !strings.Contains(header.String(), want) {
		t.Errorf("envoy.yaml's header does not say %q:\n%s", want, header.String())
	}
}

// nativeBootstrap is an Envoy bootstrap with the native module's filter
// (filter_name tokenbucket) whose filter_config is the StringValue cfg, and
// another module's filter, which is not ours to check.
func nativeBootstrap(cfg string) string {
	return withFilters(`          - name: other
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
              dynamic_module_config: { name: other }
              filter_name: other
              filter_config: { "@type": type.googleapis.com/google.protobuf.StringValue, value: "not ours" }
          - name: envoy.filters.http.dynamic_modules
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
              dynamic_module_config: { name: tokenbucket, do_not_close: true }
              filter_name: tokenbucket
              filter_config:
                "@type": type.googleapis.com/google.protobuf.StringValue
                value: |
                  ` + cfg + `
`)
}

// TestNativeModuleConfigurations: make lint reads the native module's
// configurations as it reads the plugin's: the dynamic module filter of an
// Envoy configuration (and so of an Istio EnvoyFilter's patch), and an
// Envoy Gateway EnvoyExtensionPolicy's spec.dynamicModule config, the
// places docs/native.md sends native users. (Each was refused as "no
// plugin configuration".)
func TestNativeModuleConfigurations(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	policy := func(cfg string) string {
		return `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyExtensionPolicy
metadata: { name: tokenbucket, namespace: default }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: eg }]
  dynamicModule:
  - name: tokenbucket
    filterName: tokenbucket
    config: ` + cfg + `
`
	}
	for _, tc := range []struct {
		name, file string
		code       int
		want       string
	}{
		{"envoy good", write("native-good.yaml", nativeBootstrap(good)), 0, "ok   "},
		{"envoy bad", write("native-bad.yaml", nativeBootstrap(bad)), 1, "FAIL "},
		{"policy good", write("policy-good.yaml", policy(good)), 0, "ok   "},
		{"policy bad", write("policy-bad.yaml", policy(bad)), 1, "FAIL "},
		{"policy string", write("policy-string.yaml", policy(strconv.Quote(good))), 1, "FAIL "},
		{"istio example", "../../examples/istio/native-envoyfilter.yaml", 0, "ok   "},
		{"envoy gateway example", "../../examples/envoy-gateway/native.yaml", 0, "ok   "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run([]string{tc.file}, nil, &out, &errOut)
			if code != tc.code {
				t.Fatalf("exit %d, want %d:\n%s%s", code, tc.code, out.String(), errOut.String())
			}
			for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
				if !strings.HasPrefix(line, tc.want) {
					t.Errorf("line %q, want it to start %q", line, tc.want)
				}
				if strings.Contains(line, "not ours") || strings.Contains(line, `"other"`) {
					t.Errorf("another module's filter was checked: %q", line)
				}
			}
			if tc.code == 1 && !strings.Contains(out.String(), "burst") && tc.name != "policy string" {
				t.Errorf("the refusal does not say what is wrong:\n%s", out.String())
			}
		})
	}
}
