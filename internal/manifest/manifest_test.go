// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package manifest

import (
	"fmt"
	"strings"
	"testing"
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
    service: {cluster: "outbound|8081||limitd.ratelimit.svc.cluster.local", authority: %s}
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
  ports: [{name: http, port: 8081}]
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
