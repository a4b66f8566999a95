package istio_test

import (
	"maps"
	"reflect"
	"strings"
	"testing"

	clientnetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/manifest"
)

// TestNativeEnvoyFilters: each EnvoyFilter of native-envoyfilter.yaml loads
// the native module well-formed, with a configuration the plugin accepts,
// equal to that of the WasmPlugin for the same workloads (same namespace,
// same selector), so the two ways of running the plugin stay the same
// example; and the examples hold a Deployment for each EnvoyFilter whose
// istio-proxy can load the module (manifest.Validate checks them; a
// missing one would be a note).
func TestNativeEnvoyFilters(t *testing.T) {
	docs := loadExamples(t)
	r := manifest.Validate(docs, manifest.Options{RequireClusters: true})
	for _, err := range r.Errors {
		t.Error(err)
	}
	for _, n := range r.Notes {
		if strings.Contains(n, "EnvoyFilter") {
			t.Errorf("note: %s", n)
		}
	}
	plugins := wasmPlugins(docs)
	filters := 0
	for _, d := range docs {
		ef, ok := d.Obj.(*clientnetv1a3.EnvoyFilter)
		if !ok {
			continue
		}
		nf, err := manifest.NativeFilters(ef)
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if len(nf) != 1 {
			t.Fatalf("%s: %d filters of the native module, want 1", d, len(nf))
		}
		filters++
		native, err := config.Parse(nf[0].Config)
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		var twin string
		for file, wp := range plugins {
			if wp.Namespace == ef.Namespace && maps.Equal(wp.Spec.GetSelector().GetMatchLabels(), ef.Spec.GetWorkloadSelector().GetLabels()) {
				twin = file
				if wasm := parseIstioConfig(t, wp); !reflect.DeepEqual(native, wasm) {
					t.Errorf("%s (EnvoyFilter %s): the configuration\n%+v\ndiffers from %s's\n%+v", d, ef.Name, native, file, wasm)
				}
			}
		}
		if twin == "" {
			t.Errorf("%s (EnvoyFilter %s/%s): no WasmPlugin for the same workloads to compare with", d, ef.Namespace, ef.Name)
		}
	}
	if filters == 0 || r.NativeFilters != filters {
		t.Fatalf("%d EnvoyFilters of the native module, Validate counted %d", filters, r.NativeFilters)
	}
}
