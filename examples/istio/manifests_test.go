// Package istio_test proves the Istio examples right: every manifest decodes
// strictly into the Istio and Kubernetes API types (an unknown or misspelt
// field fails; package manifest, which `make validate-istio` also uses), each
// WasmPlugin's pluginConfig passes the plugin's own configuration parser in
// the exact JSON form Istio hands the plugin, cluster rules name an Envoy
// cluster the manifests create, and envoy-istio.yaml is the configuration
// Istio generates from the gateway WasmPlugin.
package istio_test

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	clientext "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	clientnet "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/manifest"
)

const envoyTemplate = "envoy-istio.yaml"

// istioPluginConfig returns the configuration string Istio gives the plugin
// for wp: spec.pluginConfig, a google.protobuf.Struct, marshalled to JSON by
// protojson (pilot/pkg/model/extensions.go), then wrapped in a StringValue.
func istioPluginConfig(t *testing.T, wp *clientext.WasmPlugin) []byte {
	t.Helper()
	b, err := manifest.PluginConfig(wp)
	if err != nil {
		t.Fatalf("%s/%s: %v", wp.Namespace, wp.Name, err)
	}
	return b
}

func wasmPlugins(docs []manifest.Doc) map[string]*clientext.WasmPlugin {
	out := map[string]*clientext.WasmPlugin{}
	for _, d := range docs {
		if wp, ok := d.Obj.(*clientext.WasmPlugin); ok {
			out[d.File] = wp
		}
	}
	return out
}

// clusters returns the Envoy clusters Istio builds for the Services and
// ServiceEntries of docs, outbound|<port>||<host>, mapped to their host.
func clusters(docs []manifest.Doc) map[string]string { return manifest.Clusters(docs) }

// TestManifestsDecodeStrictly: every manifest decodes strictly, and the
// examples show each kind the guide talks about.
func TestManifestsDecodeStrictly(t *testing.T) {
	docs := loadExamples(t)
	count := map[string]int{}
	for _, d := range docs {
		count[d.Kind]++
	}
	for _, k := range []string{"WasmPlugin", "EnvoyFilter", "Service", "ServiceEntry", "DestinationRule", "AuthorizationPolicy", "PeerAuthentication", "Deployment", "Secret"} {
		if count[k] == 0 {
			t.Errorf("no %s in the examples (all: %v)", k, count)
		}
	}
}

// TestWasmPlugins checks validity, not the examples' choices (failStrategy,
// phase, selectors and limits are the user's to edit): every pluginConfig
// passes the plugin's parser as Istio hands it over, each cluster rule names
// a cluster these manifests create with its host as authority, every such
// host has a DestinationRule, and no two WasmPlugins share a pluginName.
func TestWasmPlugins(t *testing.T) {
	docs := loadExamples(t)
	r := manifest.Validate(docs, manifest.Options{RequireClusters: true})
	for _, err := range r.Errors {
		t.Error(err)
	}
	if r.Plugins == 0 {
		t.Fatal("no WasmPlugin in the examples")
	}
	drHosts := map[string]bool{}
	for _, d := range docs {
		if dr, ok := d.Obj.(*clientnet.DestinationRule); ok {
			drHosts[dr.Spec.Host] = true
		}
	}
	known := clusters(docs)
	for file, wp := range wasmPlugins(docs) {
		if !strings.HasPrefix(wp.Spec.Url, "oci://") || !sha256Pattern.MatchString(wp.Spec.Sha256) {
			t.Errorf("%s: url %q sha256 %q: the examples show an oci:// url pinned by sha256 (make oci fills both in)", file, wp.Spec.Url, wp.Spec.Sha256)
		}
		for _, rule := range parseIstioConfig(t, wp).Rules {
			if rule.Scope == config.ScopeCluster && !drHosts[known[rule.Service.Cluster]] {
				t.Errorf("%s: rule %s: no DestinationRule for %s", file, rule.Name, known[rule.Service.Cluster])
			}
		}
	}
}

// TestPluginConfigSurvivesIstio checks that protojson's rewriting of
// pluginConfig (sorted keys, its own number spelling) changes nothing: the
// configuration parsed from Istio's JSON equals the one parsed from the
// manifest's own JSON.
func TestPluginConfigSurvivesIstio(t *testing.T) {
	docs := loadExamples(t)
	for file, wp := range wasmPlugins(docs) {
		raw := rawDoc(t, docs, file, "WasmPlugin")
		direct, err := json.Marshal(raw["spec"].(map[string]any)["pluginConfig"])
		if err != nil {
			t.Fatal(err)
		}
		a, err := config.Parse(direct)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		b, err := config.Parse(istioPluginConfig(t, wp))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: the manifest's configuration\n%+v\nbecomes, through Istio,\n%+v", file, a, b)
		}
	}
}

// TestExternalServiceEntryComment keeps the comment of
// limit-service-external.yaml true: the cluster and authority it tells users
// to write are the ones its ServiceEntry creates.
func TestExternalServiceEntryComment(t *testing.T) {
	const file = "limit-service-external.yaml"
	docs := loadManifest(t, file)
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cs := clusters(docs)
	if len(cs) != 1 {
		t.Fatalf("%s creates clusters %v, want one", file, keys(cs))
	}
	for c, host := range cs {
		for _, want := range []string{"cluster: " + c, "authority: " + host} {
			if !bytes.Contains(text, []byte(want)) {
				t.Errorf("%s: its comment should say %q", file, want)
			}
		}
	}
}

// rawDoc returns the JSON object of the document of kind in file.
func rawDoc(t *testing.T, docs []manifest.Doc, file, kind string) map[string]any {
	t.Helper()
	for _, d := range docs {
		if d.File != file {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(d.Raw, &m); err != nil {
			t.Fatal(err)
		}
		if m["kind"] == kind {
			return m
		}
	}
	t.Fatalf("%s: no %s", file, kind)
	return nil
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// mutation changes a decoded document; it reports false when it does not
// apply to that document.
type mutation struct {
	name  string
	apply func(m map[string]any) bool
}

var mutations = []mutation{
	{"unknown top-level field", func(m map[string]any) bool { m["specs"] = map[string]any{}; return true }},
	{"unknown metadata field", func(m map[string]any) bool {
		m["metadata"].(map[string]any)["label"] = "x"
		return true
	}},
	{"unknown spec field", func(m map[string]any) bool {
		spec, ok := m["spec"].(map[string]any)
		if ok {
			spec["failStrategyy"] = "FAIL_OPEN"
		}
		return ok
	}},
	{"unknown field deep in spec", func(m map[string]any) bool {
		spec, _ := m["spec"].(map[string]any)
		obj := deepestObject(spec)
		if obj == nil {
			return false
		}
		obj["bogus"] = true
		return true
	}},
	{"snake_case spelling of a spec field", func(m map[string]any) bool {
		spec, _ := m["spec"].(map[string]any)
		for _, k := range keys(spec) {
			if s := snake(k); s != k {
				spec[s] = spec[k]
				delete(spec, k)
				return true
			}
		}
		return false
	}},
	{"wrong type", func(m map[string]any) bool {
		spec, _ := m["spec"].(map[string]any)
		for _, k := range keys(spec) {
			if _, ok := spec[k].(map[string]any); ok && k != "pluginConfig" {
				spec[k] = []any{1}
				return true
			}
		}
		return false
	}},
}

// deepestObject returns the most nested JSON object under v, skipping
// pluginConfig (free-form), or nil.
func deepestObject(v map[string]any) map[string]any {
	best, bestDepth := map[string]any(nil), 0
	var walk func(x any, depth int)
	walk = func(x any, depth int) {
		switch x := x.(type) {
		case map[string]any:
			if depth > bestDepth {
				best, bestDepth = x, depth
			}
			for _, k := range keys(x) {
				if k != "pluginConfig" {
					walk(x[k], depth+1)
				}
			}
		case []any:
			for _, e := range x {
				walk(e, depth+1)
			}
		}
	}
	walk(v, 0)
	if bestDepth < 2 {
		return nil
	}
	return best
}

func snake(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func TestUnknownFieldsFail(t *testing.T) {
	for _, d := range loadExamples(t) {
		for _, mu := range mutations {
			var m map[string]any
			if err := json.Unmarshal(d.Raw, &m); err != nil {
				t.Fatal(err)
			}
			if !mu.apply(m) {
				continue
			}
			j, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := manifest.DecodeStrict(j); err == nil {
				t.Errorf("%s: %s: the decoder accepted it", d, mu.name)
			}
		}
	}
}

// TestUnknownPluginConfigFieldFails: pluginConfig is a free-form Struct for
// Istio, so a misspelt field there is the plugin parser's to refuse.
func TestUnknownPluginConfigFieldFails(t *testing.T) {
	docs := loadExamples(t)
	for file := range wasmPlugins(docs) {
		raw := rawDoc(t, docs, file, "WasmPlugin")
		pc := raw["spec"].(map[string]any)["pluginConfig"].(map[string]any)
		rule := pc["rules"].([]any)[0].(map[string]any)
		rule["limit_key"] = []any{"header:x-api-key"}
		j, err := json.Marshal(raw)
		if err != nil {
			t.Fatal(err)
		}
		obj, err := manifest.DecodeStrict(j)
		if err != nil {
			t.Fatalf("%s: pluginConfig is free-form for Istio, yet: %v", file, err)
		}
		_, err = config.Parse(istioPluginConfig(t, obj.(*clientext.WasmPlugin)))
		if err == nil || !strings.Contains(err.Error(), "rules[0].limit_key") {
			t.Errorf("%s: misspelt rules[0].limit_key: config.Parse error %v", file, err)
		}
	}
}

func parseIstioConfig(t *testing.T, wp *clientext.WasmPlugin) *config.Config {
	t.Helper()
	cfg, err := config.Parse(istioPluginConfig(t, wp))
	if err != nil {
		t.Fatalf("%s/%s: pluginConfig: %v", wp.Namespace, wp.Name, err)
	}
	return cfg
}
