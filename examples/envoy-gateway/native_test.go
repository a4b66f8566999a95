package envoygateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"reflect"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kyaml "k8s.io/apimachinery/pkg/util/yaml"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/engine"
)

const (
	example = "native.yaml"
	// demo holds the demo rule the example's configuration must equal.
	demo = "../../envoy.yaml"
	// module and filterName are the native module's file and its HTTP
	// filter's name (the factory the module registers).
	module     = "libtokenbucket.so"
	filterName = "tokenbucket"
)

// reservedVolumes are the volumes and mounts Envoy Gateway gives its proxy
// itself (expectedVolumes and expectedContainerVolumeMounts in
// internal/infrastructure/kubernetes/proxy/resource.go): one of ours by the
// same name would replace Envoy Gateway's.
var reservedVolumes = []string{"certs", "sds", "sa-token"}

// objects is a manifest decoded by kind.
type objects struct {
	proxies  []*egv1a1.EnvoyProxy
	gateways []*gwapiv1.Gateway
	policies []*egv1a1.EnvoyExtensionPolicy
	// routes and trafficPolicies are global.yaml's.
	routes          []*gwapiv1.HTTPRoute
	trafficPolicies []*egv1a1.BackendTrafficPolicy
}

// decode strictly decodes every document of a manifest into Envoy Gateway's
// and the Gateway API's types, as the API server does with field validation
// Strict: an unknown or misspelt field, a duplicate key or a wrong type is
// an error, and so is a kind the example has no business holding.
func decode(b []byte) (objects, error) {
	var objs objects
	r := kyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for i := 0; ; i++ {
		y, err := r.Read()
		if err == io.EOF {
			return objs, nil
		}
		if err != nil {
			return objs, fmt.Errorf("document %d: %w", i, err)
		}
		j, err := yaml.YAMLToJSONStrict(y) // refuses duplicate keys
		if err != nil {
			return objs, fmt.Errorf("document %d: %w", i, err)
		}
		if string(j) == "null" {
			i-- // only comments
			continue
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(j, &tm); err != nil {
			return objs, fmt.Errorf("document %d: %w", i, err)
		}
		switch gvk := tm.APIVersion + "/" + tm.Kind; gvk {
		case egv1a1.GroupVersion.String() + "/" + egv1a1.KindEnvoyProxy:
			err = strictInto(j, &objs.proxies)
		case egv1a1.GroupVersion.String() + "/" + egv1a1.KindEnvoyExtensionPolicy:
			err = strictInto(j, &objs.policies)
		case gwapiv1.GroupVersion.String() + "/Gateway":
			err = strictInto(j, &objs.gateways)
		case gwapiv1.GroupVersion.String() + "/HTTPRoute":
			err = strictInto(j, &objs.routes)
		case egv1a1.GroupVersion.String() + "/" + egv1a1.KindBackendTrafficPolicy:
			err = strictInto(j, &objs.trafficPolicies)
		default:
			err = fmt.Errorf("unexpected kind %s", gvk)
		}
		if err != nil {
			return objs, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
	}
}

// strictInto decodes j into a new T with every field known (sigs.k8s.io/json,
// the API server's decoder) and appends it to list.
func strictInto[T any](j []byte, list *[]*T) error {
	obj := new(T)
	strict, err := kjson.UnmarshalStrict(j, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	if err := errors.Join(strict...); err != nil {
		return err
	}
	*list = append(*list, obj)
	return nil
}

// loadExample decodes the example.
func loadExample(t *testing.T) objects {
	t.Helper()
	b, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(b)
	if err != nil {
		t.Fatalf("%s: %v", example, err)
	}
	return objs
}

// nativeModule is one dynamic module filter of a policy, resolved against
// the EnvoyProxy of the Gateway it targets.
type nativeModule struct {
	at     string // where the filter is, for messages
	filter egv1a1.DynamicModule
	entry  *egv1a1.DynamicModuleEntry
	proxy  *egv1a1.EnvoyProxy
}

// resolve returns every dynamic module filter of the policies with the
// EnvoyProxy registry entry it names, as Envoy Gateway's translator finds it
// (buildDynamicModules in internal/gatewayapi/envoyextensionpolicy.go: the
// registry of the EnvoyProxy of the targeted Gateway, by name; a name not in
// it rejects the policy). Only Gateway targets in the manifest are followed.
func resolve(objs objects) ([]nativeModule, error) {
	var out []nativeModule
	for _, p := range objs.policies {
		if len(p.Spec.DynamicModule) == 0 {
			continue
		}
		if len(p.Spec.TargetRefs) == 0 {
			return nil, fmt.Errorf("EnvoyExtensionPolicy %s: no spec.targetRefs", p.Name)
		}
		for ti, ref := range p.Spec.TargetRefs {
			if ref.Kind != "Gateway" {
				return nil, fmt.Errorf("EnvoyExtensionPolicy %s: spec.targetRefs[%d]: kind %s, the example targets Gateways", p.Name, ti, ref.Kind)
			}
			gw := find(objs.gateways, p.Namespace, string(ref.Name), func(g *gwapiv1.Gateway) metav1.ObjectMeta { return g.ObjectMeta })
			if gw == nil {
				return nil, fmt.Errorf("EnvoyExtensionPolicy %s: spec.targetRefs[%d]: no Gateway %s/%s", p.Name, ti, p.Namespace, ref.Name)
			}
			pr := gw.Spec.Infrastructure
			if pr == nil || pr.ParametersRef == nil || pr.ParametersRef.Kind != egv1a1.KindEnvoyProxy || string(pr.ParametersRef.Group) != egv1a1.GroupName {
				return nil, fmt.Errorf("Gateway %s: spec.infrastructure.parametersRef names no EnvoyProxy", gw.Name)
			}
			proxy := find(objs.proxies, gw.Namespace, pr.ParametersRef.Name, func(e *egv1a1.EnvoyProxy) metav1.ObjectMeta { return e.ObjectMeta })
			if proxy == nil {
				return nil, fmt.Errorf("Gateway %s: no EnvoyProxy %s/%s", gw.Name, gw.Namespace, pr.ParametersRef.Name)
			}
			for i, dm := range p.Spec.DynamicModule {
				at := fmt.Sprintf("EnvoyExtensionPolicy %s: spec.dynamicModule[%d]", p.Name, i)
				var entry *egv1a1.DynamicModuleEntry
				for k := range proxy.Spec.DynamicModules {
					if proxy.Spec.DynamicModules[k].Name == dm.Name {
						entry = &proxy.Spec.DynamicModules[k]
					}
				}
				if entry == nil {
					return nil, fmt.Errorf("%s.name: %q is not in EnvoyProxy %s's spec.dynamicModules (Envoy Gateway rejects the policy)", at, dm.Name, proxy.Name)
				}
				out = append(out, nativeModule{at: at, filter: dm, entry: entry, proxy: proxy})
			}
		}
	}
	return out, nil
}

// find returns the object of list with namespace ns and name, or nil.
func find[T any](list []*T, ns, name string, meta func(*T) metav1.ObjectMeta) *T {
	for _, o := range list {
		if m := meta(o); m.Namespace == ns && m.Name == name {
			return o
		}
	}
	return nil
}

// check returns what would keep the module from loading or from taking its
// configuration, for one filter: the filter name the module registers, a
// configuration that is a JSON object the engine accepts (Envoy Gateway
// passes config's JSON text as it is: dynamicModuleConfig in
// internal/xds/translator/dynamicmodule.go), a local source at an absolute
// path whose file is libtokenbucket.so, doNotClose, a volume mounted into
// Envoy's container at the file's folder that is not an image volume (on
// Linux those are typically mounted noexec) and, as an emptyDir, is written
// by an init container, and GODEBUG=cgocheck=0 in that container's
// environment.
func check(m nativeModule) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if fn := m.filter.FilterName; fn == nil || *fn != filterName {
		fail("%s.filterName: want %q, the module's filter", m.at, filterName)
	}
	switch {
	case m.filter.Config == nil || len(m.filter.Config.Raw) == 0:
		fail("%s.config: missing: the module refuses an empty configuration", m.at)
	case bytes.TrimSpace(m.filter.Config.Raw)[0] != '{':
		fail("%s.config: not a JSON object (%.40s): Envoy Gateway passes the JSON text as it is, so a string reaches the module quoted", m.at, m.filter.Config.Raw)
	default:
		if err := engine.CheckConfiguration(m.filter.Config.Raw); err != nil {
			fail("%s.config: %w", m.at, err)
		}
	}
	e := m.entry
	src := e.Source
	if src.Type != nil && *src.Type != egv1a1.LocalDynamicModuleSourceType || src.Local == nil {
		fail("EnvoyProxy %s: spec.dynamicModules[%s].source: want a Local source (the example mounts the file)", m.proxy.Name, e.Name)
		return errs
	}
	file := src.Local.Path
	if !path.IsAbs(file) || path.Base(file) != module {
		fail("EnvoyProxy %s: spec.dynamicModules[%s].source.local.path: %q, want an absolute path to %s", m.proxy.Name, e.Name, file, module)
	}
	if e.DoNotClose == nil || !*e.DoNotClose {
		fail("EnvoyProxy %s: spec.dynamicModules[%s].doNotClose: want true (a Go runtime cannot be unloaded)", m.proxy.Name, e.Name)
	}
	k := m.proxy.Spec.Provider
	if k == nil || k.Type != egv1a1.EnvoyProxyProviderTypeKubernetes || k.Kubernetes == nil || k.Kubernetes.EnvoyDeployment == nil ||
		k.Kubernetes.EnvoyDeployment.Container == nil || k.Kubernetes.EnvoyDeployment.Pod == nil {
		fail("EnvoyProxy %s: spec.provider.kubernetes.envoyDeployment: want its container and pod, which put the module and GODEBUG into Envoy's container", m.proxy.Name)
		return errs
	}
	dep := k.Kubernetes.EnvoyDeployment
	godebug := false
	for _, v := range dep.Container.Env {
		if v.Name == "GODEBUG" {
			for _, s := range strings.Split(v.Value, ",") {
				godebug = godebug || strings.TrimSpace(s) == "cgocheck=0"
			}
		}
	}
	if !godebug {
		fail("EnvoyProxy %s: envoyDeployment.container.env: no GODEBUG with cgocheck=0 (without it the Go runtime aborts Envoy at the module's first configuration)", m.proxy.Name)
	}
	var vol *corev1.Volume // the pod volume mounted over the module's folder
	for _, vm := range dep.Container.VolumeMounts {
		if strings.HasPrefix(file, strings.TrimSuffix(vm.MountPath, "/")+"/") {
			for i := range dep.Pod.Volumes {
				if dep.Pod.Volumes[i].Name == vm.Name {
					vol = &dep.Pod.Volumes[i]
				}
			}
		}
	}
	switch {
	case vol == nil:
		fail("EnvoyProxy %s: no volume of envoyDeployment.pod.volumes mounted by envoyDeployment.container.volumeMounts over %s", m.proxy.Name, file)
	case vol.Image != nil:
		fail("EnvoyProxy %s: envoyDeployment.pod.volumes[%s] is an image volume: on Linux the container runtime typically mounts those noexec, and Envoy cannot load a module from it (copy it into an emptyDir from an init container)", m.proxy.Name, vol.Name)
	case vol.EmptyDir != nil:
		filled := false
		for _, c := range dep.InitContainers {
			for _, vm := range c.VolumeMounts {
				filled = filled || vm.Name == vol.Name && !vm.ReadOnly
			}
		}
		if !filled {
			fail("EnvoyProxy %s: envoyDeployment.pod.volumes[%s] is an emptyDir that no init container of envoyDeployment.initContainers mounts writable: nothing puts the module there", m.proxy.Name, vol.Name)
		}
	}
	for _, v := range dep.Pod.Volumes {
		for _, r := range reservedVolumes {
			if v.Name == r {
				fail("EnvoyProxy %s: envoyDeployment.pod.volumes: %q replaces Envoy Gateway's own volume of that name", m.proxy.Name, v.Name)
			}
		}
	}
	return errs
}

// demoConfiguration is the plugin configuration of envoy.yaml's Wasm filter.
func demoConfiguration(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(demo)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var found []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["name"] == "envoy.filters.http.wasm" {
				tc, _ := v["typed_config"].(map[string]any)
				cfg, _ := tc["config"].(map[string]any)
				c, _ := cfg["configuration"].(map[string]any)
				if s, ok := c["value"].(string); ok {
					found = append(found, s)
				}
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(doc)
	if len(found) != 1 {
		t.Fatalf("%s: %d Wasm filter configurations, want 1", demo, len(found))
	}
	return []byte(found[0])
}

// TestNativeExample: native.yaml decodes strictly into Envoy Gateway's and
// the Gateway API's types, its one EnvoyExtensionPolicy filter resolves to
// the registry of the EnvoyProxy its Gateway uses, passes check, and its
// configuration is the demo rule's (envoy.yaml).
func TestNativeExample(t *testing.T) {
	objs := loadExample(t)
	mods, err := resolve(objs)
	if err != nil {
		t.Fatal(err)
	}
	if len(mods) != 1 {
		t.Fatalf("%d filters of the native module, want 1", len(mods))
	}
	for _, err := range check(mods[0]) {
		t.Error(err)
	}
	got, err := config.Parse(mods[0].filter.Config.Raw)
	if err != nil {
		t.Fatal(err)
	}
	want, err := config.Parse(demoConfiguration(t))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the example's configuration\n%+v\ndiffers from the demo rule's (%s)\n%+v", got, demo, want)
	}
}

// TestNativeExampleRefusals: the decoding and the checks refuse what would
// keep the module from loading or break it, each edit of the example by
// its own error.
func TestNativeExampleRefusals(t *testing.T) {
	src, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, old, new, want string
	}{
		{"misspelt policy field", "    filterName: tokenbucket", "    filtername: tokenbucket", `unknown field "spec.dynamicModule[0].filtername"`},
		{"misspelt EnvoyProxy field", "    doNotClose: true", "    doNotclose: true", `unknown field "spec.dynamicModules[0].doNotclose"`},
		{"misspelt Gateway field", "    parametersRef:", "    parameterRef:", `unknown field "spec.infrastructure.parameterRef"`},
		{"duplicate key", "    filterName: tokenbucket", "    filterName: tokenbucket\n    filterName: tokenbucket", "already set in map"},
		{"unregistered module", "  - name: tokenbucket     # the EnvoyProxy's", "  - name: ratelimit     # the EnvoyProxy's", "is not in EnvoyProxy tokenbucket-native's spec.dynamicModules"},
		{"no filter name", "    filterName: tokenbucket\n", "", `filterName: want "tokenbucket"`},
		{"configuration the engine refuses", "{tokens_per_second: 0.02, burst: 5}", "{tokens_per_second: 0.02, burst: -5}", "config: rules[0].algorithm_config.burst"},
		{"no GODEBUG", "value: cgocheck=0", "value: madvdontneed=1", "no GODEBUG with cgocheck=0"},
		{"relative path", "path: /usr/local/lib/tokenbucket/libtokenbucket.so", "path: libtokenbucket.so", "want an absolute path"},
		{"not mounted", "mountPath: /usr/local/lib/tokenbucket", "mountPath: /opt/tokenbucket", "no volume of envoyDeployment.pod.volumes mounted"},
		{"image volume", "            emptyDir: {}", "            image: {reference: ghcr.io/ratelimit-wasm/tokenbucket-native:0.1.0}", "is an image volume: on Linux the container runtime typically mounts those noexec"},
		{"no init container", "          - name: tokenbucket-module\n            mountPath: /module", "          - name: scratch\n            mountPath: /module", "no init container of envoyDeployment.initContainers mounts writable"},
		{"reserved volume", "tokenbucket-module", "certs", `"certs" replaces Envoy Gateway's own volume`},
		{"may be closed", "    doNotClose: true", "    doNotClose: false", "doNotClose: want true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !bytes.Contains(src, []byte(c.old)) {
				t.Fatalf("%s has no %q to edit", example, c.old)
			}
			edited := bytes.ReplaceAll(src, []byte(c.old), []byte(c.new))
			var errs []error
			objs, err := decode(edited)
			if err == nil {
				var mods []nativeModule
				if mods, err = resolve(objs); err == nil {
					for _, m := range mods {
						errs = append(errs, check(m)...)
					}
				}
			}
			err = errors.Join(append(errs, err)...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// TestConfigAsString: a configuration written as a YAML string decodes (the
// type takes any JSON) but reaches the module quoted, and check says so.
func TestConfigAsString(t *testing.T) {
	src, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(src, []byte("    config:\n"))
	if i < 0 {
		t.Fatalf("%s: no config", example)
	}
	edited := append(append([]byte{}, src[:i]...), "    config: '{\"rules\": []}'\n"...)
	objs, err := decode(edited)
	if err != nil {
		t.Fatal(err)
	}
	mods, err := resolve(objs)
	if err != nil || len(mods) != 1 {
		t.Fatalf("resolve: %d, %v", len(mods), err)
	}
	err = errors.Join(check(mods[0])...)
	if err == nil || !strings.Contains(err.Error(), "not a JSON object") {
		t.Fatalf("error %v, want not a JSON object", err)
	}
}

// docsPage is the page whose "Envoy Gateway" section shows an excerpt of
// the example.
const docsPage = "../../docs/native.md"

// TestDocsExcerpt: the YAML block of docs/native.md's "Envoy Gateway"
// section, an EnvoyProxy spec and an EnvoyExtensionPolicy spec, decodes
// strictly into Envoy Gateway's types and is an excerpt of the example:
// every value it shows is the example's, placeholders ("<...>" and [...])
// aside. So the page cannot drift from the tested file.
func TestDocsExcerpt(t *testing.T) {
	page, err := os.ReadFile(docsPage)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(page), "\n## Envoy Gateway")
	if !ok {
		t.Fatalf("%s: no Envoy Gateway section", docsPage)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, ok := strings.Cut(section, "```yaml\n")
	if ok {
		block, _, ok = strings.Cut(block, "```")
	}
	if !ok {
		t.Fatalf("%s: the Envoy Gateway section has no closed yaml block", docsPage)
	}
	docs := strings.Split(block, "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("%s: %d documents in the Envoy Gateway block, want an EnvoyProxy and an EnvoyExtensionPolicy", docsPage, len(docs))
	}
	b, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []map[string]any // the example's EnvoyProxy and EnvoyExtensionPolicy, as JSON trees
	for _, kind := range []string{egv1a1.KindEnvoyProxy, egv1a1.KindEnvoyExtensionPolicy} {
		for y := range strings.SplitSeq(string(b), "\n---\n") {
			var tree map[string]any
			if err := yaml.Unmarshal([]byte(y), &tree); err != nil {
				t.Fatal(err)
			}
			if tree["kind"] == kind {
				kinds = append(kinds, tree)
			}
		}
	}
	if len(kinds) != 2 {
		t.Fatalf("%s: %d EnvoyProxy and EnvoyExtensionPolicy, want one each", example, len(kinds))
	}
	for i, doc := range docs {
		j, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Fatalf("%s, document %d: %v", docsPage, i, err)
		}
		if i == 0 {
			var into []*struct {
				Spec egv1a1.EnvoyProxySpec `json:"spec"`
			}
			err = strictInto(j, &into)
		} else {
			var into []*struct {
				Spec egv1a1.EnvoyExtensionPolicySpec `json:"spec"`
			}
			err = strictInto(j, &into)
		}
		if err != nil {
			t.Fatalf("%s, document %d: %v", docsPage, i, err)
		}
		var tree map[string]any
		if err := json.Unmarshal(j, &tree); err != nil {
			t.Fatal(err)
		}
		if err := excerpt(tree, kinds[i], ""); err != nil {
			t.Errorf("%s, document %d (%s) is not an excerpt of %s: %v", docsPage, i, kinds[i]["kind"], example, err)
		}
	}
}

// excerpt returns an error unless every value of doc is the one at the same
// place in full; a string "<...>" and a list of one "..." are placeholders.
func excerpt(doc, full any, at string) error {
	switch d := doc.(type) {
	case map[string]any:
		f, ok := full.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: an object, the example has %v", at, full)
		}
		for k, v := range d {
			fv, ok := f[k]
			if !ok {
				return fmt.Errorf("%s.%s: not in the example", at, k)
			}
			if err := excerpt(v, fv, at+"."+k); err != nil {
				return err
			}
		}
	case []any:
		if len(d) == 1 && d[0] == "..." {
			return nil
		}
		f, ok := full.([]any)
		if !ok || len(f) != len(d) {
			return fmt.Errorf("%s: %d elements, the example has %v", at, len(d), full)
		}
		for i := range d {
			if err := excerpt(d[i], f[i], fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case string:
		if strings.HasPrefix(d, "<") && strings.HasSuffix(d, ">") {
			return nil
		}
		if d != full {
			return fmt.Errorf("%s: %q, the example has %v", at, d, full)
		}
	default:
		if !reflect.DeepEqual(doc, full) {
			return fmt.Errorf("%s: %v, the example has %v", at, doc, full)
		}
	}
	return nil
}
