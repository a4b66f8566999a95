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
// emptyDir that the init container running the module's image writes at
// /module. istio-proxy must stay an ordinary container, started after every
// init container, so that the copy is there when Envoy starts; and the
// container the module is mounted into is the one that runs pilot-agent
// and Envoy. With the sidecar pod's sidecar.istio.io/nativeSidecar turned
// to "true", the injector makes istio-proxy an init container ahead of the
// copy: what the example's "false" prevents.
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
		injected := injectDeployment(t, tmpl, values, mc, dep)
		pod := injected.Spec.Template.Spec
		for _, c := range pod.InitContainers {
			if c.Name == manifest.ProxyContainer {
				t.Errorf("%s: %s is an init container (a native sidecar): it would start before the module is copied", dep.Name, c.Name)
			}
		}
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
		emptyDir := false
		for _, v := range pod.Volumes {
			emptyDir = emptyDir || v.Name == volume && v.EmptyDir != nil
		}
		if volume == "" || !emptyDir {
			t.Errorf("%s: %s is not mounted in %s from an emptyDir (mounts %v, volumes %v)", dep.Name, dir[0], proxy.Name, proxy.VolumeMounts, pod.Volumes)
		}
		var copies []string
		for _, c := range pod.InitContainers {
			for _, m := range c.VolumeMounts {
				if m.Name == volume && m.MountPath == "/module" && !m.ReadOnly && strings.Contains(c.Image, "/tokenbucket-native") && len(c.Command) == 0 {
					copies = append(copies, c.Name)
				}
			}
		}
		if len(copies) != 1 {
			t.Errorf("%s: init containers %v of the module's image write volume %q at /module, want one (init containers: %v)", dep.Name, copies, volume, names(pod.InitContainers))
		}
		t.Logf("%s: init containers %v, the module copied by %v into %q, mounted in %s at %s", dep.Name, names(pod.InitContainers), copies, volume, proxy.Name, dir[0])

		// The annotation's work: as a native sidecar, istio-proxy comes
		// first among the init containers, ahead of the copy.
		if v, ok := dep.Spec.Template.Annotations["sidecar.istio.io/nativeSidecar"]; ok {
			if v != "false" {
				t.Errorf("%s: sidecar.istio.io/nativeSidecar %q, want \"false\"", dep.Name, v)
			}
			native := dep.DeepCopy()
			native.Spec.Template.Annotations["sidecar.istio.io/nativeSidecar"] = "true"
			order := names(injectDeployment(t, tmpl, values, mc, native).Spec.Template.Spec.InitContainers)
			proxyAt, copyAt := slices.Index(order, manifest.ProxyContainer), slices.Index(order, "tokenbucket-module")
			t.Logf("%s as a native sidecar: init containers %v", dep.Name, order)
			if proxyAt < 0 || copyAt < 0 || proxyAt > copyAt {
				t.Errorf("%s with nativeSidecar \"true\": init containers %v, want %s before tokenbucket-module (the reason for \"false\")", dep.Name, order, manifest.ProxyContainer)
			}
		}
	}
	if n != 2 {
		t.Fatalf("%d Deployments in %s, want the gateway's and the sidecar workload's", n, nativeExample)
	}
}

// injectDeployment runs Istio's injector over dep.
func injectDeployment(t *testing.T, tmpl inject.Templates, values inject.ValuesConfig, mc *meshconfig.MeshConfig, dep *appsv1.Deployment) *appsv1.Deployment {
	t.Helper()
	out, err := inject.IntoObject(nil, tmpl, values, "", mc, dep, func(w string) { t.Logf("injector: %s", w) })
	if err != nil {
		t.Fatalf("%s: injection: %v", dep.Name, err)
	}
	injected, ok := out.(*appsv1.Deployment)
	if !ok {
		t.Fatalf("%s: injection returned %T", dep.Name, out)
	}
	return injected
}

// names returns the containers' names.
func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}
