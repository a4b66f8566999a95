// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package manifest

import (
	"bytes"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/golang/protobuf/jsonpb" //nolint:staticcheck // the decoder Istio's own API types use
	meshconfig "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	clientnetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// How an EnvoyFilter loads the native module, libtokenbucket.so: Envoy's
// dynamic-modules HTTP filter, the module found by name in the folder
// SearchPathEnv names, its factory by filter name, the plugin's JSON
// configuration as a google.protobuf.StringValue.
const (
	// NativeModule is dynamic_module_config.name: Envoy loads
	// lib<NativeModule>.so.
	NativeModule = "tokenbucket"
	// NativeFilterName is filter_name, the module's HTTP filter.
	NativeFilterName = "tokenbucket"
	// DynamicModuleFilterType is the type URL of the filter's configuration.
	DynamicModuleFilterType = "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"
	// SearchPathEnv is the variable of Envoy's environment that names the
	// folder of lib<NativeModule>.so.
	SearchPathEnv = "ENVOY_DYNAMIC_MODULES_SEARCH_PATH"
	// ProxyContainer is the container Istio's injector runs Envoy in.
	ProxyContainer = "istio-proxy"

	stringValueType = "type.googleapis.com/google.protobuf.StringValue"
	// The pod annotations Istio's sidecar injector reads for istio-proxy's
	// volumes, mounts and proxy configuration (proxyMetadata becomes
	// environment variables of the container).
	userVolumeAnnotation      = "sidecar.istio.io/userVolume"
	userVolumeMountAnnotation = "sidecar.istio.io/userVolumeMount"
	proxyConfigAnnotation     = "proxy.istio.io/config"
	injectLabel               = "sidecar.istio.io/inject"
	templatesAnnotation       = "inject.istio.io/templates"
	nativeSidecarAnnotation   = "sidecar.istio.io/nativeSidecar"
)

// NativeFields are the fields, by proto name, of the Envoy messages of the
// filter block NativeFilters reads, keyed by message name. A patch value is
// a free-form google.protobuf.Struct to Istio, and istiod converts it to
// Envoy's types ignoring unknown fields (its validation only warns): a
// misspelt field of the block would be dropped without an error, so
// NativeFilters refuses keys that are none of these. e2e/istio checks the
// lists against Envoy's own protos.
var NativeFields = map[string][]string{
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter": {
		"name", "typed_config", "config_discovery", "is_optional", "disabled"},
	"envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter": {
		"dynamic_module_config", "filter_name", "filter_config", "terminal_filter"},
	"envoy.extensions.dynamic_modules.v3.DynamicModuleConfig": {
		"name", "do_not_close", "load_globally", "metrics_namespace", "module", "nack_on_cache_miss"},
}

// checkFields refuses a key of m (the JSON of message msg, at path at)
// that is neither the proto nor the JSON name of one of its NativeFields,
// "@type" aside.
func checkFields(m map[string]any, msg, at string) error {
	for k := range m {
		if k == "@type" {
			continue
		}
		known := false
		for _, f := range NativeFields[msg] {
			known = known || k == f || k == lowerCamel(f)
		}
		if !known {
			return fmt.Errorf("%s.%s: unknown field of %s (istiod would drop it)", at, k, msg)
		}
	}
	return nil
}

// lowerCamel is the JSON name protobuf gives the field name f.
func lowerCamel(f string) string {
	var b strings.Builder
	up := false
	for _, r := range f {
		switch {
		case r == '_':
			up = true
		case up:
			b.WriteString(strings.ToUpper(string(r)))
			up = false
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// NativeFilter is one configuration of the native module in an EnvoyFilter.
type NativeFilter struct {
	// Patch is the index of its patch in spec.configPatches.
	Patch int
	// Config is filter_config's StringValue: the bytes the module receives.
	Config []byte
}

// NativeFilters returns the native module's filters in ef: each patch whose
// value is a DynamicModuleFilter naming the module NativeModule. Such a
// patch must apply to HTTP_FILTER, name the filter NativeFilterName and
// carry the configuration as a StringValue, or it is an error; filters of
// other dynamic modules are left alone. Keys may have the proto (snake_case)
// or the JSON (camelCase) spelling, as Istio's conversion accepts both; a
// key of the filter, its typed_config or dynamic_module_config that is no
// field of Envoy's messages (NativeFields) is an error, and filter_config
// may hold only @type and value.
func NativeFilters(ef *clientnetv1a3.EnvoyFilter) ([]NativeFilter, error) {
	var out []NativeFilter
	for i, cp := range ef.Spec.ConfigPatches {
		if cp.GetPatch().GetValue() == nil {
			continue
		}
		at := fmt.Sprintf("spec.configPatches[%d].patch.value", i)
		value := cp.Patch.Value.AsMap()
		tc, _ := field(value, "typed_config", "typedConfig").(map[string]any)
		if tc["@type"] != DynamicModuleFilterType {
			continue
		}
		dmc, _ := field(tc, "dynamic_module_config", "dynamicModuleConfig").(map[string]any)
		if dmc["name"] != NativeModule {
			continue
		}
		if cp.ApplyTo != networking.EnvoyFilter_HTTP_FILTER {
			return nil, fmt.Errorf("spec.configPatches[%d].applyTo: %s, want HTTP_FILTER for the dynamic-modules HTTP filter", i, cp.ApplyTo)
		}
		for _, c := range []struct {
			m       map[string]any
			msg, at string
		}{
			{value, "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter", at},
			{tc, "envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter", at + ".typed_config"},
			{dmc, "envoy.extensions.dynamic_modules.v3.DynamicModuleConfig", at + ".typed_config.dynamic_module_config"},
		} {
			if err := checkFields(c.m, c.msg, c.at); err != nil {
				return nil, err
			}
		}
		at += ".typed_config"
		if name := field(tc, "filter_name", "filterName"); name != NativeFilterName {
			return nil, fmt.Errorf("%s.filter_name: %v, want %q", at, name, NativeFilterName)
		}
		fc, ok := field(tc, "filter_config", "filterConfig").(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s.filter_config: missing (the module needs its JSON configuration)", at)
		}
		if fc["@type"] != stringValueType {
			return nil, fmt.Errorf("%s.filter_config: @type %v, want %s holding the JSON configuration", at, fc["@type"], stringValueType)
		}
		for k := range fc {
			if k != "@type" && k != "value" {
				return nil, fmt.Errorf("%s.filter_config.%s: unknown field of a StringValue", at, k)
			}
		}
		s, ok := fc["value"].(string)
		if !ok {
			return nil, fmt.Errorf("%s.filter_config.value: want the JSON configuration as a string", at)
		}
		out = append(out, NativeFilter{Patch: i, Config: []byte(s)})
	}
	return out, nil
}

// field returns m[proto] or, when absent, m[camel].
func field(m map[string]any, proto, camel string) any {
	if v, ok := m[proto]; ok {
		return v
	}
	return m[camel]
}

// selects reports whether the EnvoyFilter ef applies to the pods of d: a
// workload selector's labels are a subset of the pod's, and the namespace
// is ef's or ef is in the root namespace (which applies to every
// namespace). Pods labelled sidecar.istio.io/inject=false run no proxy.
func selects(ef *clientnetv1a3.EnvoyFilter, d *appsv1.Deployment, rootNamespace string) bool {
	if ef.Namespace != d.Namespace && ef.Namespace != rootNamespace {
		return false
	}
	labels := d.Spec.Template.Labels
	if labels[injectLabel] == "false" {
		return false
	}
	for k, v := range ef.Spec.GetWorkloadSelector().GetLabels() {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// proxySetup is what a pod template gives its istio-proxy container, from
// the container itself (a gateway's Deployment, or injection customised by
// a container of that name) and from the injector's annotations.
type proxySetup struct {
	env     map[string][]string // name: every value given
	mounts  map[string]string   // mount path (cleaned): volume name
	volumes map[string]bool
	// emptyDirs are the pod's emptyDir volumes; written, the volumes an
	// init container other than istio-proxy mounts writable.
	emptyDirs, written map[string]bool
	// sidecar: istio-proxy comes from the sidecar template (the pod asks
	// for no gateway template), which makes it a native sidecar, started
	// before the pod's init containers, unless nativeSidecar is "false".
	sidecar, nativeSidecarOff bool
}

// readProxySetup collects d's istio-proxy setup; an annotation that does not
// decode strictly is an error.
func readProxySetup(d *appsv1.Deployment) (*proxySetup, error) {
	s := &proxySetup{env: map[string][]string{}, mounts: map[string]string{}, volumes: map[string]bool{},
		emptyDirs: map[string]bool{}, written: map[string]bool{}}
	pod := &d.Spec.Template
	for _, v := range pod.Spec.Volumes {
		s.volumes[v.Name] = true
		s.emptyDirs[v.Name] = v.EmptyDir != nil
	}
	for _, c := range pod.Spec.InitContainers {
		for _, m := range c.VolumeMounts {
			if c.Name != ProxyContainer && !m.ReadOnly {
				s.written[m.Name] = true
			}
		}
	}
	s.sidecar = !strings.Contains(pod.Annotations[templatesAnnotation], "gateway")
	s.nativeSidecarOff = pod.Annotations[nativeSidecarAnnotation] == "false"
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if c.Name != ProxyContainer {
			continue
		}
		for _, e := range c.Env {
			s.env[e.Name] = append(s.env[e.Name], e.Value)
		}
		for _, m := range c.VolumeMounts {
			s.mounts[path.Clean(m.MountPath)] = m.Name
		}
	}
	ann := pod.Annotations
	if a, ok := ann[userVolumeAnnotation]; ok {
		var vols map[string]corev1.VolumeSource
		if err := strictJSON([]byte(a), &vols); err != nil {
			return nil, fmt.Errorf("annotation %s: %w", userVolumeAnnotation, err)
		}
		for name, v := range vols {
			s.volumes[name] = true
			s.emptyDirs[name] = v.EmptyDir != nil
		}
	}
	if a, ok := ann[userVolumeMountAnnotation]; ok {
		var mounts map[string]corev1.VolumeMount
		if err := strictJSON([]byte(a), &mounts); err != nil {
			return nil, fmt.Errorf("annotation %s: %w", userVolumeMountAnnotation, err)
		}
		for name, m := range mounts {
			s.mounts[path.Clean(m.MountPath)] = name
		}
	}
	if a, ok := ann[proxyConfigAnnotation]; ok {
		j, err := yaml.YAMLToJSONStrict([]byte(a))
		if err != nil {
			return nil, fmt.Errorf("annotation %s: %w", proxyConfigAnnotation, err)
		}
		var pc meshconfig.ProxyConfig
		if err := (&jsonpb.Unmarshaler{}).Unmarshal(bytes.NewReader(j), &pc); err != nil {
			return nil, fmt.Errorf("annotation %s: %w", proxyConfigAnnotation, err)
		}
		for k, v := range pc.ProxyMetadata {
			s.env[k] = append(s.env[k], v)
		}
	}
	return s, nil
}

// cgocheckOff reports whether the GODEBUG value v turns the cgo pointer
// check off: its last cgocheck setting, the one the Go runtime keeps, is 0.
func cgocheckOff(v string) bool {
	off := false
	for _, kv := range strings.Split(v, ",") {
		if k, val, ok := strings.Cut(strings.TrimSpace(kv), "="); ok && k == "cgocheck" {
			off = val == "0"
		}
	}
	return off
}

// checkNativeProxy returns what keeps the istio-proxy of d from loading the
// native module: Envoy's environment needs GODEBUG with cgocheck=0 and
// SearchPathEnv naming a folder mounted from a volume of the pod; an
// emptyDir there needs an init container writing it, and on a sidecar
// that init container runs first only with nativeSidecar "false".
func checkNativeProxy(d *appsv1.Deployment) []string {
	s, err := readProxySetup(d)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	one := func(name, want string) (string, bool) {
		vs := slices.Compact(slices.Sorted(slices.Values(s.env[name])))
		switch len(vs) {
		case 0:
			problems = append(problems, fmt.Sprintf("%s: no %s in its environment, want %s (container env or proxy.istio.io/config proxyMetadata)", ProxyContainer, name, want))
		case 1:
			return vs[0], true
		default:
			problems = append(problems, fmt.Sprintf("%s: %s set to different values %q", ProxyContainer, name, vs))
		}
		return "", false
	}
	if v, ok := one("GODEBUG", "cgocheck=0"); ok && !cgocheckOff(v) {
		problems = append(problems, fmt.Sprintf("%s: GODEBUG %q lacks cgocheck=0: the Go runtime aborts Envoy at the module's first configuration", ProxyContainer, v))
	}
	if dir, ok := one(SearchPathEnv, "the folder of lib"+NativeModule+".so"); ok {
		vol, mounted := s.mounts[path.Clean(dir)]
		switch {
		case !mounted:
			problems = append(problems, fmt.Sprintf("%s: %s is %s, where nothing is mounted (mounts: %v)", ProxyContainer, SearchPathEnv, dir, sortedKeys(s.mounts)))
		case !s.volumes[vol]:
			problems = append(problems, fmt.Sprintf("%s: %s is mounted from volume %q, but the pod has no volume of that name", ProxyContainer, dir, vol))
		case s.emptyDirs[vol] && !s.written[vol]:
			problems = append(problems, fmt.Sprintf("%s: %s is mounted from emptyDir %q, which no init container mounts writable: nothing puts lib%s.so there", ProxyContainer, dir, vol, NativeModule))
		case s.written[vol] && s.sidecar && !s.nativeSidecarOff:
			problems = append(problems, fmt.Sprintf("%s: an init container writes volume %q, but as a native sidecar (Istio's default where Kubernetes has them) istio-proxy starts before the pod's init containers, so Envoy would look for the module before it is there: annotate the pod %s: \"false\"", ProxyContainer, vol, nativeSidecarAnnotation))
		}
	}
	return problems
}

// checkNativeWorkloads checks every Deployment of docs that the EnvoyFilter
// of doc selects; with none among docs it returns a note.
func checkNativeWorkloads(docs []Doc, doc Doc, ef *clientnetv1a3.EnvoyFilter, rootNamespace string) (errs []error, note string) {
	selected := 0
	for _, d := range docs {
		dep, ok := d.Obj.(*appsv1.Deployment)
		if !ok || !selects(ef, dep, rootNamespace) {
			continue
		}
		selected++
		for _, p := range checkNativeProxy(dep) {
			errs = append(errs, fmt.Errorf("%s (Deployment %s/%s, selected by EnvoyFilter %s/%s): %s", d, dep.Namespace, dep.Name, ef.Namespace, ef.Name, p))
		}
	}
	if selected == 0 {
		note = fmt.Sprintf("%s (EnvoyFilter %s/%s): none of these manifests' Deployments is selected; each proxy it selects needs %s mounted, %s naming its folder and GODEBUG=cgocheck=0",
			doc, ef.Namespace, ef.Name, "lib"+NativeModule+".so", SearchPathEnv)
	}
	return errs, note
}
