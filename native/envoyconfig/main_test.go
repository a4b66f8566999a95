package main

import (
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestConvertDemo: the demo's configuration becomes the native module's,
// with the same plugin configuration and no Wasm filter left.
func TestConvertDemo(t *testing.T) {
	in, err := os.ReadFile("../../envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := Convert(in)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "envoy.filters.http.wasm") {
		t.Errorf("a Wasm filter is left:\n%s", out)
	}
	var doc any
	if err := yaml.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	var wasm any
	if err := yaml.Unmarshal(in, &wasm); err != nil {
		t.Fatal(err)
	}
	const filters = "static_resources.listeners.0.filter_chains.0.filters.0.typed_config.http_filters.0.typed_config."
	got := at(t, doc, filters+"filter_config.value").(string)
	want := at(t, wasm, filters+"config.configuration.value").(string)
	if strings.Join(strings.Fields(got), "") != strings.Join(strings.Fields(want), "") {
		t.Errorf("filter_config.value = %s, want the Wasm plugin's %s", got, want)
	}
	if name := at(t, doc, filters+"filter_name"); name != "tokenbucket" {
		t.Errorf("filter_name = %v", name)
	}
	// The rule label's tag extraction follows the metrics to their native
	// namespace (docs/native.md).
	if re := at(t, doc, "stats_config.stats_tags.0.regex").(string); re != `^dynamicmodulescustom\.tokenbucket\.rule\.((.+)\.)[a-z_]+$` {
		t.Errorf("stats_tags[0].regex = %s, want the demo's on the native namespace", re)
	}
}

func TestConvertRefusesNoWasm(t *testing.T) {
	if _, err := Convert([]byte("static_resources: {}\n")); err == nil {
		t.Error("a configuration without a Wasm filter converted without error")
	}
}

// at walks a dotted path of map keys and list indexes.
func at(t *testing.T, v any, path string) any {
	t.Helper()
	for _, k := range strings.Split(path, ".") {
		switch c := v.(type) {
		case map[string]any:
			v = c[k]
		case []any:
			i := int(k[0] - '0')
			if i >= len(c) {
				t.Fatalf("%s: index %s out of range", path, k)
			}
			v = c[i]
		default:
			t.Fatalf("%s: %q not found", path, k)
		}
	}
	return v
}
