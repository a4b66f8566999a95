package istio

import (
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	meshconfig "istio.io/api/mesh/v1alpha1"
	"istio.io/istio/operator/pkg/render"
	istiomesh "istio.io/istio/pkg/config/mesh"
	"istio.io/istio/pkg/kube/inject"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/manifest"
)

// stockInjector renders Istio 1.31's own charts (compiled into the module,
// as istioctl carries them) with the default profile's injector and returns
// the injection templates, values and mesh configuration istiod would run
// them with.
func stockInjector(t *testing.T) (inject.Templates, inject.ValuesConfig, *meshconfig.MeshConfig) {
	t.Helper()
	sets, _, err := render.GenerateManifest(nil, []string{"profile=default"}, false, nil, nil)
	if err != nil {
		t.Fatalf("rendering Istio's charts: %v", err)
	}
	var tmpl inject.Templates
	var values inject.ValuesConfig
	var mc *meshconfig.MeshConfig
	for _, set := range sets {
		for _, o := range set.Manifests {
			if o.GetKind() != "ConfigMap" {
				continue
			}
			data, _ := o.Object["data"].(map[string]any)
			switch o.GetName() {
			case "istio-sidecar-injector":
				cfg, err := inject.UnmarshalConfig([]byte(data["config"].(string)))
				if err != nil {
					t.Fatal(err)
				}
				if values, err = inject.NewValuesConfig(data["values"].(string)); err != nil {
					t.Fatal(err)
				}
				tmpl = cfg.Templates
			case "istio":
				if mc, err = istiomesh.ApplyMeshConfig(data["mesh"].(string), istiomesh.DefaultMeshConfig()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if tmpl == nil || mc == nil {
		t.Fatal("no istio-sidecar-injector or istio ConfigMap in Istio's rendered charts")
	}
	return tmpl, values, mc
}

// TestNativeInjection runs Istio 1.31's injector with its stock templates
// (the sidecar one, and the gateway one the gateway Deployment asks for)
// over the example's Deployments, as `istioctl kube-inject` does, and checks
// what the istio-proxy container gets: GODEBUG=cgocheck=0 and
// ENVOY_DYNAMIC_MODULES_SEARCH_PATH in its environment (pilot-agent starts
// Envoy with its own environment), and that folder mounted from the pod's
// image volume of the module. It also checks the container the module is
// mounted into is the one that runs pilot-agent and Envoy.
func TestNativeInjection(t *testing.T) {
	tmpl, values, mc := stockInjector(t)
	b, err := os.ReadFile(nativeExample)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := manifest.Decode(nativeExample, b)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range docs {
		dep, ok := d.Obj.(*appsv1.Deployment)
		if !ok {
			continue
		}
		n++
		out, err := inject.IntoObject(nil, tmpl, values, "", mc, dep, func(w string) { t.Logf("injector: %s", w) })
		if err != nil {
			t.Fatalf("%s: injection: %v", dep.Name, err)
		}
		injected, ok := out.(*appsv1.Deployment)
		if !ok {
			t.Fatalf("%s: injection returned %T", dep.Name, out)
		}
		pod := injected.Spec.Template.Spec
		var proxy *corev1.Container
		for i := range pod.Containers {
			if pod.Containers[i].Name == manifest.ProxyContainer {
				proxy = &pod.Containers[i]
			}
		}
		if proxy == nil {
			y, _ := yaml.Marshal(injected)
			t.Fatalf("%s: no %s container after injection:\n%s", dep.Name, manifest.ProxyContainer, y)
		}
		env := map[string][]string{}
		for _, e := range proxy.Env {
			env[e.Name] = append(env[e.Name], e.Value)
		}
		t.Logf("%s: %s image %s args %v, GODEBUG %q, %s %q", dep.Name, proxy.Name, proxy.Image, proxy.Args,
			env["GODEBUG"], manifest.SearchPathEnv, env[manifest.SearchPathEnv])
		if !slices.Contains(proxy.Args, "proxy") {
			t.Errorf("%s: %s args %v: not pilot-agent's proxy command", dep.Name, proxy.Name, proxy.Args)
		}
		if g := env["GODEBUG"]; len(g) != 1 || !slices.Contains(strings.Split(g[0], ","), "cgocheck=0") {
			t.Errorf("%s: GODEBUG %q in %s's environment, want one with cgocheck=0", dep.Name, g, proxy.Name)
		}
		dir := env[manifest.SearchPathEnv]
		if len(dir) != 1 {
			t.Fatalf("%s: %s %q in %s's environment, want one folder", dep.Name, manifest.SearchPathEnv, dir, proxy.Name)
		}
		var volume string
		for _, m := range proxy.VolumeMounts {
			if path.Clean(m.MountPath) == path.Clean(dir[0]) {
				volume = m.Name
			}
		}
		var image string
		for _, v := range pod.Volumes {
			if v.Name == volume && v.Image != nil {
				image = v.Image.Reference
			}
		}
		if volume == "" || image == "" {
			t.Errorf("%s: %s is not mounted in %s from an image volume (mounts %v, volumes %v)", dep.Name, dir[0], proxy.Name, proxy.VolumeMounts, pod.Volumes)
		}
	}
	if n != 2 {
		t.Fatalf("%d Deployments in %s, want the gateway's and the sidecar workload's", n, nativeExample)
	}
}
