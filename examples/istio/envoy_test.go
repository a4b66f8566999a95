package istio_test

import (
	"encoding/json"
	"os"
	"testing"

	extensions "istio.io/api/extensions/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// failurePolicy is Istio's mapping of WasmPlugin.failStrategy to the Wasm
// filter's failure_policy (pilot/pkg/model/extensions.go, Istio >= 1.25).
var failurePolicy = map[extensions.FailStrategy]string{
	extensions.FailStrategy_FAIL_OPEN:   "FAIL_OPEN",
	extensions.FailStrategy_FAIL_CLOSE:  "FAIL_CLOSED",
	extensions.FailStrategy_FAIL_RELOAD: "FAIL_RELOAD",
}

func renderEnvoyIstio(t *testing.T, pluginConfig string, servicePort int) map[string]any {
	t.Helper()
	tmpl, err := os.ReadFile(envoyTemplate)
	if err != nil {
		t.Fatal(err)
	}
	out, err := envoytest.RenderConfig(string(tmpl), envoytest.TemplateData{
		ListenerPort: 10000, AdminPort: 10001, UpstreamPort: 10002, ServicePort: servicePort,
		PluginWasm: "/plugins/plugin.wasm", PluginConfig: pluginConfig, FailurePolicy: "FAIL_CLOSED",
	})
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSONStrict([]byte(out))
	if err != nil {
		t.Fatalf("rendered %s is not YAML: %v\n%s", envoyTemplate, err, out)
	}
	var m map[string]any
	if err := json.Unmarshal(j, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// at walks a decoded JSON value by map keys and list indexes.
func at(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %v: %q of a %T", path, k, v)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("at %v: [%d] of a %T", path, k, v)
			}
			v = l[k]
		}
	}
	return v
}

// TestEnvoyIstioIsWhatIstioGenerates compares envoy-istio.yaml with what
// Istio builds from wasmplugin-gateway.yaml.
func TestEnvoyIstioIsWhatIstioGenerates(t *testing.T) {
	docs := loadExamples(t)
	wp := wasmPlugins(docs)["wasmplugin-gateway.yaml"]
	pc := string(istioPluginConfig(t, wp))
	cfg := renderEnvoyIstio(t, pc, 10003)

	filters := at(t, cfg, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config", "http_filters").([]any)
	wasm := filters[0].(map[string]any)
	if got, want := wasm["name"], "extensions.istio.io/wasmplugin/"+wp.Namespace+"."+wp.Name; got != want {
		t.Errorf("filter name %v, want %v", got, want)
	}
	tc := wasm["typed_config"].(map[string]any)
	if tc["@type"] != "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm" {
		t.Errorf("filter type %v", tc["@type"])
	}
	pcfg := tc["config"].(map[string]any)
	checks := []struct {
		what      string
		got, want any
	}{
		{"config.name", pcfg["name"], wp.Namespace + "." + wp.Name},
		{"config.root_id (spec.pluginName)", pcfg["root_id"], wp.Spec.PluginName},
		{"config.configuration @type", at(t, pcfg, "configuration", "@type"), "type.googleapis.com/google.protobuf.StringValue"},
		{"config.configuration value (protojson of spec.pluginConfig)", at(t, pcfg, "configuration", "value"), pc},
		{"vm_config.runtime", at(t, pcfg, "vm_config", "runtime"), "envoy.wasm.runtime.v8"},
		{"vm_config.code.local.filename", at(t, pcfg, "vm_config", "code", "local", "filename"), "/plugins/plugin.wasm"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	// failure_policy is one Istio can generate from a failStrategy. It is
	// not held to the WasmPlugin's: failStrategy is the user's choice, and
	// this file shows the shape of one generated configuration.
	valid := false
	for _, fp := range failurePolicy {
		valid = valid || pcfg["failure_policy"] == fp
	}
	if !valid {
		t.Errorf("config.failure_policy = %v, want one of %v", pcfg["failure_policy"], failurePolicy)
	}
	vm := pcfg["vm_config"].(map[string]any)
	for _, absent := range []string{"vm_id", "environment_variables", "configuration", "allow_precompiled"} {
		if _, ok := vm[absent]; ok {
			t.Errorf("vm_config.%s is set; Istio leaves it unset", absent)
		}
	}
	if _, ok := pcfg["fail_open"]; ok {
		t.Error("config.fail_open (deprecated) is set; Istio >= 1.25 sets failure_policy only")
	}
	if last := filters[len(filters)-1].(map[string]any)["name"]; last != "envoy.filters.http.router" {
		t.Errorf("last filter %v, want the router", last)
	}

	// The limit service cluster is the one the gateway's cluster rules name.
	names := clusterNames(t, cfg)
	parsed := parseIstioConfig(t, wp)
	for _, r := range parsed.Rules {
		if r.Service != nil && !names[r.Service.Cluster] {
			t.Errorf("rule %s: cluster %q not in %s (%v)", r.Name, r.Service.Cluster, envoyTemplate, keys(names))
		}
	}
	if n := clusterNames(t, renderEnvoyIstio(t, pc, 0)); len(n) != 1 {
		t.Errorf("with ServicePort 0 the clusters are %v, want the backend only", keys(n))
	}
}

func clusterNames(t *testing.T, cfg map[string]any) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, c := range at(t, cfg, "static_resources", "clusters").([]any) {
		out[c.(map[string]any)["name"].(string)] = true
	}
	return out
}
