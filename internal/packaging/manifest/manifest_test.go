// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package manifest

import (
	"fmt"
	"strings"
	"testing"

	clientnetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
)

const wasmPlugin = `apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata:
  name: rl
  namespace: istio-system
spec:
  pluginName: %s
  url: %s
  failStrategy: FAIL_CLOSE
  pluginConfig:
    service: {cluster: "outbound|8429||limitd.ratelimit.svc.cluster.local", authority: %s}
    rules:
    - name: fleet
      scope: cluster
      limit_keys: ["header:x-api-key"]
      algorithm: token_bucket
      algorithm_config: {tokens_per_second: 1, burst: 5}
`

const service = `apiVersion: v1
kind: Service
metadata: {name: limitd, namespace: ratelimit}
spec:
  selector: {app: limitd}
  ports: [{name: http, port: 8429}]
`

func plugin(name, url, authority string) string { return fmt.Sprintf(wasmPlugin, name, url, authority) }

func TestDecodeStrict(t *testing.T) {
	ok := plugin("a", "oci://r/p:1", "limitd.ratelimit.svc.cluster.local")
	if docs, err := Decode("ok.yaml", []byte(ok+"---\n# only a comment\n---\n"+service)); err != nil || len(docs) != 2 ||
		docs[0].Kind != "WasmPlugin" || docs[1].Kind != "Service" {
		t.Fatalf("Decode = %v, %v", docs, err)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"duplicate key", strings.Replace(ok, "  failStrategy: FAIL_CLOSE\n", "  failStrategy: FAIL_CLOSE\n  failStrategy: FAIL_OPEN\n", 1), "already set"},
		{"unknown spec field", strings.Replace(ok, "failStrategy", "failStrategyy", 1), "failStrategyy"},
		{"proto spelling", strings.Replace(ok, "pluginName", "plugin_name", 1), "camelCase"},
		{"bad enum", strings.Replace(ok, "FAIL_CLOSE", "FAIL_LATER", 1), "FAIL_LATER"},
		{"case of a Kubernetes field", strings.Replace(service, "selector", "Selector", 1), "Selector"},
		{"unknown Kubernetes field", strings.Replace(service, "selector", "selectors", 1), "selectors"},
		{"no namespace", strings.Replace(service, ", namespace: ratelimit", "", 1), "namespace"},
		{"unknown kind", strings.Replace(service, "kind: Service", "kind: Pod", 1), "not an expected type"},
	} {
		if _, err := Decode("x.yaml", []byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	decode := func(y string) []Doc {
		t.Helper()
		docs, err := Decode("x.yaml", []byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return docs
	}
	host := "limitd.ratelimit.svc.cluster.local"
	if r := Validate(decode(plugin("a", "oci://r/p:1", host)+"---\n"+service), Options{RequireClusters: true}); len(r.Errors) > 0 || r.Plugins != 1 || r.Rules != 1 {
		t.Errorf("valid: %+v", r)
	}
	if r := Validate(decode(plugin("a", "oci://r/p:1", host)), Options{}); len(r.Errors) > 0 || len(r.Notes) != 1 {
		t.Errorf("no Service: want a note only, got %+v", r)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"no Service, required", plugin("a", "oci://r/p:1", host), "no Service or ServiceEntry"},
		{"url", plugin("a", "r/p:1", host) + "---\n" + service, "spec.url"},
		{"authority", plugin("a", "oci://r/p:1", "limitd") + "---\n" + service, "service.authority"},
		{"pluginName twice", plugin("a", "oci://r/p:1", host) + "---\n" + strings.Replace(plugin("a", "oci://r/p:1", host), "name: rl", "name: rl2", 1) + "---\n" + service, "pluginName"},
		{"plugin refuses", strings.Replace(plugin("a", "oci://r/p:1", host), "burst: 5", "burst: 0.5", 1) + "---\n" + service, "burst"},
	} {
		r := Validate(decode(tc.yaml), Options{RequireClusters: true})
		found := false
		for _, err := range r.Errors {
			found = found || strings.Contains(err.Error(), tc.want)
		}
		if !found {
			t.Errorf("%s: errors %v, want one naming %q", tc.name, r.Errors, tc.want)
		}
	}
}

// envoyFilter is an EnvoyFilter loading the native module with a cluster
// rule (burst %s), and deployment a gateway it selects with the module's
// mount and environment (%s replaced by extra pod annotations).
const envoyFilter = `apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: tb, namespace: istio-system}
spec:
  workloadSelector:
    labels: {istio: ingressgateway}
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: GATEWAY
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {name: envoy.filters.http.router}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.dynamic_modules
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
          dynamic_module_config: {name: tokenbucket, do_not_close: true}
          filter_name: tokenbucket
          filter_config:
            "@type": type.googleapis.com/google.protobuf.StringValue
            value: '{"service": {"cluster": "outbound|8429||limitd.ratelimit.svc.cluster.local", "authority": "limitd.ratelimit.svc.cluster.local"},
              "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:x-api-key"],
              "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": %s}}]}'
`

const gatewayDeployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: gw, namespace: gateways}
spec:
  selector:
    matchLabels: {istio: ingressgateway}
  template:
    metadata:
      labels: {istio: ingressgateway}
      annotations: {%s}
    spec:
      containers:
      - name: istio-proxy
        image: auto
        env:
        - {name: ENVOY_DYNAMIC_MODULES_SEARCH_PATH, value: /opt/tb}
        - {name: GODEBUG, value: "madvdontneed=1,cgocheck=0"}
        volumeMounts:
        - {name: tb, mountPath: /opt/tb, readOnly: true}
      volumes:
      - name: tb
        image: {reference: "r/tb:1"}
`

// sidecarDeployment is a workload in namespace %s whose sidecar gets the
// module through the injector's annotations (and whose labels the
// EnvoyFilter selects).
const sidecarDeployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: app, namespace: %s}
spec:
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x, istio: ingressgateway}
      annotations:
        sidecar.istio.io/userVolume: '{"tb":{"image":{"reference":"r/tb:1"}}}'
        sidecar.istio.io/userVolumeMount: '{"tb":{"mountPath":"/opt/tb/","readOnly":true}}'
        proxy.istio.io/config: |
          proxyMetadata:
            ENVOY_DYNAMIC_MODULES_SEARCH_PATH: /opt/tb
            GODEBUG: cgocheck=0
    spec:
      containers:
      - {name: app, image: "r/app:1"}
`

// sidecarCopy turns sidecarDeployment's image volume (from the injector's
// annotation) into an emptyDir that an init container of the pod fills.
func sidecarCopy(y string) string {
	y = strings.Replace(y, `sidecar.istio.io/userVolume: '{"tb":{"image":{"reference":"r/tb:1"}}}'`, `sidecar.istio.io/userVolume: '{"tb":{"emptyDir":{}}}'`, 1)
	return strings.Replace(y, "      containers:\n      - {name: app, image: \"r/app:1\"}\n",
		"      initContainers:\n      - name: copy\n        image: r/tb:1\n        volumeMounts: [{name: tb, mountPath: /module}]\n"+
			"      containers:\n      - {name: app, image: \"r/app:1\"}\n", 1)
}

func TestNativeFilters(t *testing.T) {
	docs, err := Decode("ef.yaml", []byte(fmt.Sprintf(envoyFilter, "5")))
	if err != nil {
		t.Fatal(err)
	}
	ef, ok := docs[0].Obj.(*clientnetv1a3.EnvoyFilter)
	if !ok || docs[0].Kind != "EnvoyFilter" {
		t.Fatalf("decoded %T %q", docs[0].Obj, docs[0].Kind)
	}
	fs, err := NativeFilters(ef)
	if err != nil || len(fs) != 1 || fs[0].Patch != 0 || !strings.HasPrefix(string(fs[0].Config), `{"service": {"cluster"`) {
		t.Fatalf("NativeFilters = %+v, %v", fs, err)
	}
	ok1 := fmt.Sprintf(envoyFilter, "5")
	// The JSON spellings Istio's conversion accepts too.
	camel := strings.NewReplacer("typed_config", "typedConfig", "dynamic_module_config", "dynamicModuleConfig",
		"do_not_close", "doNotClose", "filter_name", "filterName", "filter_config", "filterConfig").Replace(ok1)
	if docs, err := Decode("ef.yaml", []byte(camel)); err != nil {
		t.Fatal(err)
	} else if fs, err := NativeFilters(docs[0].Obj.(*clientnetv1a3.EnvoyFilter)); err != nil || len(fs) != 1 {
		t.Errorf("camelCase keys: %+v, %v", fs, err)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"not an HTTP filter patch", strings.Replace(ok1, "applyTo: HTTP_FILTER", "applyTo: NETWORK_FILTER", 1), "applyTo"},
		{"another filter name", strings.Replace(ok1, "filter_name: tokenbucket", "filter_name: other", 1), "filter_name"},
		{"no filter_config", strings.Replace(ok1, "filter_config:", "filter_configs:", 1), "filter_config"},
		{"configuration not a StringValue", strings.Replace(ok1, "google.protobuf.StringValue", "google.protobuf.Struct", 1), "StringValue"},
		{"misspelt module field", strings.Replace(ok1, "do_not_close", "do_not_clos", 1), "do_not_clos"},
		{"misspelt filter field", strings.Replace(ok1, "filter_name: tokenbucket", "filter_name: tokenbucket\n          terminal: true", 1), "terminal"},
		{"misspelt HTTP filter field", strings.Replace(ok1, "name: envoy.filters.http.dynamic_modules", "name: envoy.filters.http.dynamic_modules\n        is_optinal: true", 1), "is_optinal"},
		{"more in the StringValue", strings.Replace(ok1, `"@type": type.googleapis.com/google.protobuf.StringValue`, `"@type": type.googleapis.com/google.protobuf.StringValue
            values: x`, 1), "values"},
	} {
		docs, err := Decode("ef.yaml", []byte(tc.yaml))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, err := NativeFilters(docs[0].Obj.(*clientnetv1a3.EnvoyFilter)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.want)
		}
	}
	// Another dynamic module is not this plugin's business.
	other := strings.Replace(ok1, "{name: tokenbucket, do_not_close: true}", "{name: othermodule}", 1)
	if docs, err := Decode("ef.yaml", []byte(other)); err != nil {
		t.Fatal(err)
	} else if fs, err := NativeFilters(docs[0].Obj.(*clientnetv1a3.EnvoyFilter)); err != nil || len(fs) != 0 {
		t.Errorf("another module: %+v, %v", fs, err)
	}
}

func TestValidateNative(t *testing.T) {
	decode := func(y string) []Doc {
		t.Helper()
		docs, err := Decode("x.yaml", []byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return docs
	}
	ef := fmt.Sprintf(envoyFilter, "5")
	gw := fmt.Sprintf(gatewayDeployment, "")
	valid := ef + "---\n" + service + "---\n" + gw + "---\n" + fmt.Sprintf(sidecarDeployment, "istio-system")
	if r := Validate(decode(valid), Options{RequireClusters: true}); len(r.Errors) > 0 || len(r.Notes) > 0 || r.NativeFilters != 1 || r.Rules != 1 {
		t.Errorf("valid: %+v", r)
	}
	// No selected workload among the documents: a note, not an error.
	if r := Validate(decode(ef+"---\n"+service), Options{RequireClusters: true}); len(r.Errors) > 0 || len(r.Notes) != 1 {
		t.Errorf("no workload: want one note, got %+v", r)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"module refuses", strings.Replace(valid, ef, fmt.Sprintf(envoyFilter, "0.5"), 1), "burst"},
		{"no Service, required", ef + "---\n" + gw, "no Service or ServiceEntry"},
		{"cgocheck set again", strings.Replace(valid, `"madvdontneed=1,cgocheck=0"`, `"cgocheck=0,cgocheck=1"`, 1), "cgocheck=0"},
		{"no GODEBUG", strings.Replace(valid, `"madvdontneed=1,cgocheck=0"`, "madvdontneed=1", 1), "cgocheck=0"},
		{"no search path", strings.Replace(valid, "- {name: ENVOY_DYNAMIC_MODULES_SEARCH_PATH, value: /opt/tb}\n", "", 1), "ENVOY_DYNAMIC_MODULES_SEARCH_PATH"},
		{"search path not mounted", strings.Replace(valid, "- {name: tb, mountPath: /opt/tb, readOnly: true}", "- {name: tb, mountPath: /opt/other}", 1), "/opt/tb"},
		{"mount of no volume", strings.Replace(valid, "- name: tb\n        image:", "- name: tb2\n        image:", 1), "no volume"},
		{"annotation mount of no volume", strings.Replace(valid, `'{"tb":{"image"`, `'{"tb2":{"image"`, 1), "no volume"},
		{"annotation GODEBUG missing", strings.Replace(valid, "            GODEBUG: cgocheck=0\n", "", 1), "cgocheck=0"},
		{"misspelt userVolumeMount", strings.Replace(valid, `"mountPath":"/opt/tb/"`, `"mountpath":"/opt/tb/"`, 1), "userVolumeMount"},
		{"misspelt proxy config", strings.Replace(valid, "proxyMetadata:", "proxyMetaData:", 1), "proxy.istio.io/config"},
		{"emptyDir nobody writes", strings.Replace(valid, "- name: tb\n        image: {reference: \"r/tb:1\"}", "- name: tb\n        emptyDir: {}", 1), `emptyDir "tb", which no init container mounts writable`},
		{"copied after a native sidecar starts", sidecarCopy(valid), `annotate the pod sidecar.istio.io/nativeSidecar: "false"`},
	} {
		r := Validate(decode(tc.yaml), Options{RequireClusters: true})
		found := false
		for _, err := range r.Errors {
			found = found || strings.Contains(err.Error(), tc.want)
		}
		if !found {
			t.Errorf("%s: errors %v, want one naming %q", tc.name, r.Errors, tc.want)
		}
	}
	// The examples' layout: an init container copies the module into an
	// emptyDir, on the gateway and, with nativeSidecar "false", on the
	// sidecar.
	copied := strings.Replace(valid, "- name: tb\n        image: {reference: \"r/tb:1\"}",
		"- name: tb\n        emptyDir: {}\n      initContainers:\n      - name: copy\n        image: r/tb:1\n        volumeMounts: [{name: tb, mountPath: /module}]", 1)
	copied = sidecarCopy(strings.Replace(copied, "annotations: {}", "annotations: {inject.istio.io/templates: gateway}", 1))
	copied = strings.Replace(copied, "      annotations:\n        sidecar.istio.io/userVolume", "      annotations:\n        sidecar.istio.io/nativeSidecar: \"false\"\n        sidecar.istio.io/userVolume", 1)
	if r := Validate(decode(copied), Options{RequireClusters: true}); len(r.Errors) > 0 || len(r.Notes) > 0 {
		t.Errorf("copied by init containers: %+v", r)
	}
	if r := Validate(decode(strings.Replace(copied, "inject.istio.io/templates: gateway", "inject.istio.io/templates: sidecar", 1)), Options{RequireClusters: true}); len(r.Errors) != 1 ||
		!strings.Contains(r.Errors[0].Error(), "gw") || !strings.Contains(r.Errors[0].Error(), "nativeSidecar") {
		t.Errorf("the gateway's copy under the sidecar template: %+v", r)
	}
	// An EnvoyFilter outside the root namespace selects only its own
	// namespace's workloads: the sidecar elsewhere, without GODEBUG, is
	// not its concern.
	local := strings.Replace(ef, "namespace: istio-system}", "namespace: gateways}", 1) + "---\n" + service + "---\n" + gw +
		"---\n" + strings.Replace(fmt.Sprintf(sidecarDeployment, "elsewhere"), "            GODEBUG: cgocheck=0\n", "", 1)
	if r := Validate(decode(local), Options{RequireClusters: true}); len(r.Errors) > 0 {
		t.Errorf("namespaced EnvoyFilter: %v", r.Errors)
	}
}
