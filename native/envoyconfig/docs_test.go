package main

import (
	"os"
	"strings"
	"testing"

	clientnet3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/manifest"
)

// yamlBlocks is the ```yaml blocks of a Markdown file.
func yamlBlocks(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	parts := strings.Split(string(b), "```yaml\n")
	for _, p := range parts[1:] {
		block, _, ok := strings.Cut(p, "```")
		if !ok {
			t.Fatalf("%s: a yaml block is not closed", path)
		}
		out = append(out, block)
	}
	return out
}

// TestDocsEnvoyFilter: docs/native.md's plain Envoy example inserts the
// native module's filter with a configuration the engine accepts (any
// EnvoyFilter the page shows must decode strictly into Istio's API types;
// the Istio example itself is examples/istio's).
func TestDocsEnvoyFilter(t *testing.T) {
	blocks := yamlBlocks(t, "../../docs/native.md")
	filters := 0
	for _, block := range blocks {
		var filter map[string]any
		if strings.Contains(block, "kind: EnvoyFilter") {
			docs, err := manifest.Decode("docs/native.md", []byte(block))
			if err != nil {
				t.Fatal(err)
			}
			if len(docs) != 1 {
				t.Fatalf("%d documents, want the EnvoyFilter", len(docs))
			}
			ef, ok := docs[0].Obj.(*clientnet3.EnvoyFilter)
			if !ok || len(ef.Spec.ConfigPatches) != 1 {
				t.Fatalf("decoded %T, want an EnvoyFilter with one patch", docs[0].Obj)
			}
			b, err := ef.Spec.ConfigPatches[0].Patch.Value.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal(b, &filter); err != nil {
				t.Fatal(err)
			}
		} else if strings.HasPrefix(block, "http_filters:") {
			var list struct {
				HTTPFilters []map[string]any `json:"http_filters"`
			}
			if err := yaml.UnmarshalStrict([]byte(block), &list); err != nil {
				t.Fatal(err)
			}
			filter = list.HTTPFilters[0]
		} else {
			continue
		}
		filters++
		if filter["name"] != "envoy.filters.http.dynamic_modules" ||
			lookup(filter, "typed_config", "filter_name") != "tokenbucket" ||
			lookup(filter, "typed_config", "dynamic_module_config", "name") != "tokenbucket" {
			t.Errorf("not the native module's filter: %v", filter)
		}
		value, _ := lookup(filter, "typed_config", "filter_config", "value").(string)
		if err := engine.CheckConfiguration([]byte(value)); err != nil || value == "" {
			t.Errorf("filter_config.value %q: %v", value, err)
		}
	}
	if filters != 1 {
		t.Fatalf("docs/native.md has %d native filter examples, want the plain Envoy one", filters)
	}
}
