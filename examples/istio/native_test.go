package istio_test

import (
	"encoding/json"
	"maps"
	"reflect"
	"strings"
	"testing"

	clientnetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

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

// TestNativeModuleLayout: each Deployment of native-envoyfilter.yaml gets
// the module the way that works where the container runtime mounts image
// volumes noexec: no image volume at all; an init container running the
// module's image (cmd/installmodule, its entrypoint) mounts an emptyDir
// writable at /module, and istio-proxy mounts that emptyDir read-only at
// its ENVOY_DYNAMIC_MODULES_SEARCH_PATH (manifest.Validate, in
// TestNativeEnvoyFilters, checks the mount and the environment); the
// sidecar's pod keeps istio-proxy out of native sidecars, so the copy is
// done before it starts.
func TestNativeModuleLayout(t *testing.T) {
	deps := 0
	for _, d := range loadExamples(t) {
		dep, ok := d.Obj.(*appsv1.Deployment)
		if !ok || !strings.HasSuffix(d.File, "native-envoyfilter.yaml") {
			continue
		}
		deps++
		pod := dep.Spec.Template
		annotationVolumes := map[string]corev1.VolumeSource{}
		if a, ok := pod.Annotations["sidecar.istio.io/userVolume"]; ok {
			if err := json.Unmarshal([]byte(a), &annotationVolumes); err != nil {
				t.Fatalf("%s: %v", d, err)
			}
		}
		emptyDirs := map[string]bool{}
		volumes := annotationVolumes // and the pod's own
		for _, v := range pod.Spec.Volumes {
			volumes[v.Name] = v.VolumeSource
		}
		for name, v := range volumes {
			if v.Image != nil {
				t.Errorf("%s (%s): volume %q is an image volume; on Linux those are typically mounted noexec", d, dep.Name, name)
			}
			emptyDirs[name] = v.EmptyDir != nil
		}
		copies := 0
		for _, c := range pod.Spec.InitContainers {
			if !strings.Contains(c.Image, "/tokenbucket-native") {
				continue
			}
			for _, m := range c.VolumeMounts {
				if m.MountPath == "/module" && !m.ReadOnly && emptyDirs[m.Name] {
					copies++
				}
			}
			if len(c.Command) > 0 || len(c.Args) > 0 {
				t.Errorf("%s (%s): init container %q overrides the image's entrypoint, which copies the module into /module", d, dep.Name, c.Name)
			}
		}
		if copies != 1 {
			t.Errorf("%s (%s): %d init containers of the module's image copy it into an emptyDir at /module, want 1", d, dep.Name, copies)
		}
		if !strings.Contains(pod.Annotations["inject.istio.io/templates"], "gateway") && pod.Annotations["sidecar.istio.io/nativeSidecar"] != "false" {
			t.Errorf("%s (%s): a sidecar pod without sidecar.istio.io/nativeSidecar: \"false\": istio-proxy would start before the copy", d, dep.Name)
		}
	}
	if deps != 2 {
		t.Fatalf("%d Deployments in native-envoyfilter.yaml, want 2 (the gateway and the auth sidecar)", deps)
	}
}
