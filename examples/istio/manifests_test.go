// Package istio_test proves the Istio examples right: every manifest decodes
// strictly into the Istio API types (an unknown or misspelt field fails), each
// WasmPlugin's pluginConfig passes the plugin's own configuration parser in
// the exact JSON form Istio hands the plugin, cluster rules name an Envoy
// cluster the manifests create, and envoy-istio.yaml is the configuration
// Istio generates from the gateway WasmPlugin.
package istio_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	extensions "istio.io/api/extensions/v1alpha1"
	typev1beta1 "istio.io/api/type/v1beta1"
	clientext "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	clientnet "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ratelimit-wasm/tokenbucket/config"
)

const envoyTemplate = "envoy-istio.yaml"

// istioPluginConfig returns the configuration string Istio gives the plugin
// for wp: spec.pluginConfig, a google.protobuf.Struct, marshalled to JSON by
// protojson (pilot/pkg/model/extensions.go), then wrapped in a StringValue.
func istioPluginConfig(t *testing.T, wp *clientext.WasmPlugin) []byte {
	t.Helper()
	if wp.Spec.PluginConfig == nil {
		t.Fatalf("%s/%s: no pluginConfig", wp.Namespace, wp.Name)
	}
	b, err := protojson.Marshal(wp.Spec.PluginConfig)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wasmPlugins(docs []doc) map[string]*clientext.WasmPlugin {
	out := map[string]*clientext.WasmPlugin{}
	for _, d := range docs {
		if wp, ok := d.obj.(*clientext.WasmPlugin); ok {
			out[d.file] = wp
		}
	}
	return out
}

// clusters returns the Envoy clusters Istio builds for the Services and
// ServiceEntries of docs, outbound|<port>||<host>, mapped to their host.
func clusters(docs []doc) map[string]string {
	out := map[string]string{}
	for _, d := range docs {
		switch o := d.obj.(type) {
		case *corev1.Service:
			host := o.Name + "." + o.Namespace + ".svc.cluster.local"
			for _, p := range o.Spec.Ports {
				out["outbound|"+strconv.Itoa(int(p.Port))+"||"+host] = host
			}
		case *clientnet.ServiceEntry:
			for _, h := range o.Spec.Hosts {
				for _, p := range o.Spec.Ports {
					out["outbound|"+strconv.Itoa(int(p.Number))+"||"+h] = h
				}
			}
		}
	}
	return out
}

func TestManifestsDecodeStrictly(t *testing.T) {
	docs := loadExamples(t)
	count := map[string]int{}
	for _, d := range docs {
		count[fmt.Sprintf("%T", d.obj)]++
	}
	want := map[string]int{
		"*v1alpha1.WasmPlugin":    2,
		"*v1.Service":             1,
		"*v1.ServiceEntry":        1,
		"*v1.DestinationRule":     2,
		"*v1.AuthorizationPolicy": 2,
	}
	for k, n := range want {
		if count[k] != n {
			t.Errorf("%s: %d in the examples, want %d (all: %v)", k, count[k], n, count)
		}
	}
}

func TestWasmPlugins(t *testing.T) {
	docs := loadExamples(t)
	known := clusters(docs)
	drHosts := map[string]bool{}
	for _, d := range docs {
		if dr, ok := d.obj.(*clientnet.DestinationRule); ok {
			drHosts[dr.Spec.Host] = true
		}
	}
	tests := []struct {
		file         string
		selectorKey  string
		selectorVal  string
		mode         typev1beta1.WorkloadMode
		failStrategy extensions.FailStrategy
		phase        extensions.PluginPhase
	}{
		{"wasmplugin-gateway.yaml", "istio", "ingressgateway", typev1beta1.WorkloadMode_CLIENT, extensions.FailStrategy_FAIL_OPEN, extensions.PluginPhase_AUTHZ},
		{"wasmplugin-sidecar.yaml", "app", "auth", typev1beta1.WorkloadMode_SERVER, extensions.FailStrategy_FAIL_CLOSE, extensions.PluginPhase_AUTHN},
	}
	plugins := wasmPlugins(docs)
	if len(plugins) != len(tests) {
		t.Fatalf("%d WasmPlugins, want %d", len(plugins), len(tests))
	}
	rootIDs := map[string]string{}
	for _, tt := range tests {
		wp := plugins[tt.file]
		if wp == nil {
			t.Fatalf("%s: no WasmPlugin", tt.file)
		}
		s := &wp.Spec
		raw := rawDoc(t, docs, tt.file, "WasmPlugin")
		if got := s.GetSelector().GetMatchLabels()[tt.selectorKey]; got != tt.selectorVal {
			t.Errorf("%s: selector %s = %q, want %q", tt.file, tt.selectorKey, got, tt.selectorVal)
		}
		if !strings.HasPrefix(s.Url, "oci://") {
			t.Errorf("%s: url %q is not oci://", tt.file, s.Url)
		}
		if !sha256Pattern.MatchString(s.Sha256) {
			t.Errorf("%s: sha256 %q does not match the CRD's ^[a-f0-9]{64}$", tt.file, s.Sha256)
		}
		if s.ImagePullPolicy == extensions.PullPolicy_UNSPECIFIED_POLICY {
			t.Errorf("%s: imagePullPolicy not set", tt.file)
		}
		// failStrategy's zero value is FAIL_CLOSE: it must be written out,
		// chosen, not defaulted.
		if _, ok := raw["spec"].(map[string]any)["failStrategy"]; !ok || s.FailStrategy != tt.failStrategy {
			t.Errorf("%s: failStrategy %v (written: %v), want %v", tt.file, s.FailStrategy, ok, tt.failStrategy)
		}
		if s.Phase != tt.phase || s.Priority == nil {
			t.Errorf("%s: phase %v priority %v, want phase %v and a priority", tt.file, s.Phase, s.Priority, tt.phase)
		}
		if len(s.Match) == 0 {
			t.Errorf("%s: no match", tt.file)
		}
		for i, m := range s.Match {
			if m.Mode != tt.mode || len(m.Ports) == 0 {
				t.Errorf("%s: match[%d] mode %v ports %v, want mode %v with ports", tt.file, i, m.Mode, m.Ports, tt.mode)
			}
		}
		if s.PluginName == "" {
			t.Errorf("%s: pluginName (the root_id, which prefixes the plugin's shared-data keys) not set", tt.file)
		} else if other, dup := rootIDs[s.PluginName]; dup {
			t.Errorf("%s: pluginName %q also used by %s", tt.file, s.PluginName, other)
		}
		rootIDs[s.PluginName] = tt.file

		cfg, err := config.Parse(istioPluginConfig(t, wp))
		if err != nil {
			t.Errorf("%s: pluginConfig, as Istio passes it, is refused by the plugin: %v", tt.file, err)
			continue
		}
		for _, r := range cfg.Rules {
			if r.Scope != config.ScopeCluster {
				continue
			}
			host, ok := known[r.Service.Cluster]
			if !ok {
				t.Errorf("%s: rule %s: service.cluster %q is not a cluster the manifests create (%v)", tt.file, r.Name, r.Service.Cluster, keys(known))
				continue
			}
			if r.Service.Authority != host {
				t.Errorf("%s: rule %s: service.authority %q, want the service host %q", tt.file, r.Name, r.Service.Authority, host)
			}
			if !drHosts[host] {
				t.Errorf("%s: rule %s: no DestinationRule for %s", tt.file, r.Name, host)
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
func rawDoc(t *testing.T, docs []doc, file, kind string) map[string]any {
	t.Helper()
	for _, d := range docs {
		if d.file != file {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(d.raw, &m); err != nil {
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
		m["spec"].(map[string]any)["failStrategyy"] = "FAIL_OPEN"
		return true
	}},
	{"unknown field deep in spec", func(m map[string]any) bool {
		obj := deepestObject(m["spec"].(map[string]any))
		if obj == nil {
			return false
		}
		obj["bogus"] = true
		return true
	}},
	{"snake_case spelling of a spec field", func(m map[string]any) bool {
		spec := m["spec"].(map[string]any)
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
		spec := m["spec"].(map[string]any)
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
			if err := json.Unmarshal(d.raw, &m); err != nil {
				t.Fatal(err)
			}
			if !mu.apply(m) {
				continue
			}
			j, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := decodeStrict(j); err == nil {
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
		obj, err := decodeStrict(j)
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
