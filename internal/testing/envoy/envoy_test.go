// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestBootstrapSwitches renders every combination of the bootstrap's
// switches and checks that the result is YAML with what each switch says.
func TestBootstrapSwitches(t *testing.T) {
	for _, lds := range []bool{false, true} {
		for _, up := range []int{0, 3} {
			for _, noWasm := range []bool{false, true} {
				for _, svc := range []int{0, 4} {
					d, err := Data(Options{LDS: lds, UpstreamPort: up, NoWasm: noWasm, ServicePort: svc,
						PluginWasm: "/p/plugin.wasm", PluginConfig: `{"a":"b \" # c"}`, Filters: "- name: extra"})
					if err != nil {
						t.Fatal(err)
					}
					if lds {
						d.LDSDir = "/lds"
					}
					got, err := Render(Bootstrap, d)
					var doc map[string]any
					if err == nil {
						err = yaml.Unmarshal([]byte(got), &doc)
					}
					if err != nil {
						t.Fatalf("lds %v upstream %d noWasm %v service %d: %v\n%s", lds, up, noWasm, svc, err, got)
					}
					for want, on := range map[string]bool{
						"watched_directory": lds, "cluster_name: upstream": up != 0, "direct_response": up == 0 && !lds,
						"cluster_name: limit_service": svc != 0, `value: "{\"a\":\"b \\\" # c\"}"`: !noWasm && !lds,
						"- name: extra": !lds,
					} {
						if strings.Contains(got, want) != on {
							t.Errorf("lds %v upstream %d noWasm %v service %d: contains %q = %v\n%s", lds, up, noWasm, svc, want, !on, got)
						}
					}
					if lds {
						d.Version = "7"
						l, err := render(Bootstrap, "lds", d)
						if err == nil {
							err = yaml.Unmarshal([]byte(l), &doc)
						}
						if err != nil || !strings.Contains(l, `version_info: "7"`) || strings.Contains(l, "wasm") == noWasm {
							t.Fatalf("lds file: %v\n%s", err, l)
						}
					}
				}
			}
		}
	}
}

func TestRenderFunctions(t *testing.T) {
	for _, s := range []string{"", "quote \" backslash \\ newline\n tab\t <html> {{x}}", "\x00\u2028"} {
		q, err := jsonText(s)
		var back string
		if err != nil || strings.ContainsAny(q, "\n\t") || json.Unmarshal([]byte(q), &back) != nil || back != s {
			t.Errorf("yamlstr(%q) = %s (%v), reads back as %q", s, q, err, back)
		}
	}
	if _, err := Render("{{.Data.nope}}", TemplateData{Data: map[string]any{}}); err == nil {
		t.Errorf("a missing Data key rendered")
	}
	if got := indent(2, "a\nb\n"); got != "  a\n  b" {
		t.Errorf("indent = %q", got)
	}
}

func TestParseStatsJSON(t *testing.T) {
	got, err := ParseStatsJSON([]byte(`{"stats":[{"name":"a.b","value":3},{"histograms":{}},` +
		`{"name":"big","value":18446744073709551615},{"name":"f","value":1e3}]}`))
	if err != nil || len(got) != 3 || got["a.b"] != 3 || got["big"] != 1<<64-1 || got["f"] != 1000 {
		t.Errorf("ParseStatsJSON() = %v, %v", got, err)
	}
	// Text readouts are strings (an xDS version_text such as Istio's
	// "2026-11-26T02:27:42Z/10"): neither counter nor gauge, skipped.
	got, err = ParseStatsJSON([]byte(`{"stats":[{"name":"v","value":"2026-11-26T02:27:42Z/10"},{"name":"w","value":"1"},{"name":"c","value":2}]}`))
	if err != nil || len(got) != 1 || got["c"] != 2 {
		t.Errorf("ParseStatsJSON(text readouts) = %v, %v; want only c = 2", got, err)
	}
	for _, bad := range []string{`{"stats":[{"name":"n","value":-1}]}`, `{"stats":[{"name":"o","value":{}}]}`, `a: 3`} {
		if _, err := ParseStatsJSON([]byte(bad)); err == nil {
			t.Errorf("ParseStatsJSON(%s) gave no error", bad)
		}
	}
}

func TestTail(t *testing.T) {
	for _, tt := range []struct {
		s    string
		n    int
		want string
	}{{"a\nb\nc\n", 2, "b\nc"}, {"a\nb", 5, "a\nb"}, {"", 3, ""}, {strings.Repeat("y", 9000), 1, "..." + strings.Repeat("y", 8192)}} {
		if got := Tail(tt.s, tt.n); got != tt.want {
			t.Errorf("Tail(%.20q, %d) = %.20q, want %.20q", tt.s, tt.n, got, tt.want)
		}
	}
}

// TestWhichErrors: a missing tool or version is an error that says what to
// run, before func-e is asked (it would try to download a missing version).
func TestWhichErrors(t *testing.T) {
	home := t.TempDir()
	t.Setenv("FUNC_E_BIN", filepath.Join(home, "no-func-e"))
	if _, err := Which(home, "9.9.9"); err == nil || !strings.Contains(err.Error(), "no Envoy 9.9.9") {
		t.Errorf("Which(empty home) = %v, want no Envoy 9.9.9", err)
	}
	bin := BinaryIn(home, "9.9.9")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Which(home, "9.9.9"); err == nil || !strings.Contains(err.Error(), "FUNC_E_BIN") ||
		!strings.Contains(err.Error(), "make setup") {
		t.Errorf("Which(no tool) = %v, want FUNC_E_BIN ... make setup", err)
	}
	t.Setenv("FUNC_E_BIN", "")
	t.Setenv("PATH", home)
	if _, err := FuncE(); err == nil || !strings.Contains(err.Error(), "make setup") {
		t.Errorf("FuncE(not on PATH) = %v, want an error naming make setup", err)
	}
}

// TestBootstrapNative: Build Native renders the dynamic modules filter with
// the same plugin JSON as the Wasm filter's, and the environment that loads
// the module; one Envoy takes one native module, named libNAME.so.
func TestBootstrapNative(t *testing.T) {
	const cfg = `{"rules":[{"name":"x \" y"}]}`
	d, err := Data(Options{Build: Native, NativeModule: "/m/libtokenbucket.so", PluginConfig: cfg, UpstreamPort: 3})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Render(Bootstrap, d)
	var doc map[string]any
	if err == nil {
		err = yaml.Unmarshal([]byte(got), &doc)
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, got)
	}
	for want, on := range map[string]bool{
		"envoy.filters.http.dynamic_modules": true, `dynamic_module_config: {name: "tokenbucket", do_not_close: true}`: true,
		"filter_name: tokenbucket": true, `value: "{\"rules\":[{\"name\":\"x \\\" y\"}]}"`: true,
		"envoy.filters.http.wasm": false, "failure_policy": false,
	} {
		if strings.Contains(got, want) != on {
			t.Errorf("contains %q = %v\n%s", want, !on, got)
		}
	}
	if d.NativeName != "tokenbucket" || d.NativeModule != "/m/libtokenbucket.so" {
		t.Errorf("NativeName, NativeModule = %q, %q", d.NativeName, d.NativeModule)
	}
	if env := NativeEnv(d.NativeModule); len(env) != 2 || env[0] != "ENVOY_DYNAMIC_MODULES_SEARCH_PATH=/m" || env[1] != "GODEBUG=cgocheck=0" {
		t.Errorf("NativeEnv() = %q", env)
	}
	if env := NativeEnv(""); env != nil {
		t.Errorf("NativeEnv(\"\") = %q, want none", env)
	}
	if b := (&Process{data: d}).Build(); b != Native || b.StatPrefix() != "dynamicmodulescustom." || Wasm.StatPrefix() != "wasmcustom." {
		t.Errorf("Build() = %v, prefixes %q, %q", b, b.StatPrefix(), Wasm.StatPrefix())
	}
	for name, opts := range map[string]Options{
		"two modules": {Listeners: []Listener{{Native: "/a/libtokenbucket.so"}, {Native: "/b/libtokenbucket.so"}}},
		"both builds": {Listeners: []Listener{{Native: "/a/libtokenbucket.so", Wasm: "/p.wasm"}}},
		"not libNAME": {Build: Native, NativeModule: "/m/tokenbucket.so"},
	} {
		if _, err := Data(opts); err == nil {
			t.Errorf("%s: Data() gave no error", name)
		}
	}
}

// TestBootstrapRateLimit renders Envoy's own rate limit filter with route
// and filter rate limits and checks the YAML says what RateLimit says.
func TestBootstrapRateLimit(t *testing.T) {
	route := RateLimitsYAML(
		Descriptor{Actions: []Action{RequestHeaders("x-api-key", "api_key")}},
		Descriptor{Actions: []Action{GenericKey("", "all"), RequestHeaders("x-user", "user")}},
	)
	filter := RateLimitsYAML(Descriptor{Actions: []Action{GenericKey("weighted", "yes")}, HitsAddend: "%REQ(x-hits)%"})
	d, err := Data(Options{NoWasm: true, UpstreamPort: 3, RLSPort: 5,
		RateLimit: &RateLimit{Domain: "edge", FailureModeDeny: true, RouteRateLimits: route}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Render(Bootstrap, d)
	if err != nil {
		t.Fatal(err)
	}
	d.Listeners[0].RateLimit.RouteRateLimits = ""
	d.Listeners[0].RateLimit.FilterRateLimits = filter
	withFilter, err := Render(Bootstrap, d)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		StaticResources struct {
			Listeners []struct {
				FilterChains []struct {
					Filters []struct {
						TypedConfig struct {
							RouteConfig struct {
								VirtualHosts []struct {
									Routes []struct {
										Route struct {
											RateLimits []struct {
												Actions []map[string]map[string]string `json:"actions"`
											} `json:"rate_limits"`
										} `json:"route"`
									} `json:"routes"`
								} `json:"virtual_hosts"`
							} `json:"route_config"`
							HTTPFilters []struct {
								Name        string         `json:"name"`
								TypedConfig map[string]any `json:"typed_config"`
							} `json:"http_filters"`
						} `json:"typed_config"`
					} `json:"filters"`
				} `json:"filter_chains"`
			} `json:"listeners"`
			Clusters []map[string]any `json:"clusters"`
		} `json:"static_resources"`
	}
	empty := doc
	if err := yaml.Unmarshal([]byte(got), &doc); err != nil || len(doc.StaticResources.Listeners) != 1 {
		t.Fatalf("%v\n%s", err, got)
	}
	hcm := doc.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig
	rls := hcm.RouteConfig.VirtualHosts[0].Routes[0].Route.RateLimits
	if len(rls) != 2 || rls[0].Actions[0]["request_headers"]["header_name"] != "x-api-key" ||
		rls[1].Actions[0]["generic_key"]["descriptor_value"] != "all" || rls[1].Actions[1]["request_headers"]["descriptor_key"] != "user" {
		t.Errorf("route rate_limits = %+v\n%s", rls, got)
	}
	if len(hcm.HTTPFilters) != 2 || hcm.HTTPFilters[0].Name != "envoy.filters.http.ratelimit" {
		t.Fatalf("http_filters = %+v, want the rate limit filter and the router", hcm.HTTPFilters)
	}
	doc = empty
	if err := yaml.Unmarshal([]byte(withFilter), &doc); err != nil {
		t.Fatalf("%v\n%s", err, withFilter)
	}
	hcm = doc.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig
	if rls := hcm.RouteConfig.VirtualHosts[0].Routes[0].Route.RateLimits; len(rls) != 0 {
		t.Errorf("the filter's rate limits: route rate_limits = %+v, want none", rls)
	}
	f := hcm.HTTPFilters[0].TypedConfig
	b, _ := json.Marshal(f)
	for _, want := range []string{`"domain":"edge"`, `"failure_mode_deny":true`, `"enable_x_ratelimit_headers":"DRAFT_VERSION_03"`,
		`"cluster_name":"rls"`, `"transport_api_version":"V3"`, `"hits_addend":{"format":"%REQ(x-hits)%"}`, `"descriptor_key":"weighted"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("rate limit filter %s: want %s", b, want)
		}
	}
	var rlsCluster string
	for _, c := range doc.StaticResources.Clusters {
		if c["name"] == "rls" {
			b, _ := json.Marshal(c)
			rlsCluster = string(b)
		}
	}
	if !strings.Contains(rlsCluster, `"http2_protocol_options":{}`) || !strings.Contains(rlsCluster, `"port_value":5`) {
		t.Errorf("cluster rls = %s, want HTTP/2 on port 5", rlsCluster)
	}

	for name, opts := range map[string]Options{
		"no RLSPort":            {NoWasm: true, UpstreamPort: 3, RateLimit: &RateLimit{Domain: "d"}},
		"route without a route": {NoWasm: true, RLSPort: 5, RateLimit: &RateLimit{Domain: "d", RouteRateLimits: route}},
		"route and filter":      {NoWasm: true, UpstreamPort: 3, RLSPort: 5, RateLimit: &RateLimit{Domain: "d", RouteRateLimits: route, FilterRateLimits: filter}},
	} {
		if _, err := Data(opts); err == nil {
			t.Errorf("%s: Data accepted it", name)
		}
	}
}

// TestBootstrapRateLimitQuota renders Envoy's own rate limit quota filter
// and checks the YAML says what RateLimitQuota says; Envoy itself loads it
// in e2e's TestRLQSValidate.
func TestBootstrapRateLimitQuota(t *testing.T) {
	q := &RateLimitQuota{Domain: "edge", Headers: []BucketHeader{{"api_key", "x-api-key"}},
		ReportingInterval: 1500 * time.Millisecond, Expired: "REUSE_LAST_ASSIGNMENT"}
	for _, headers := range [][]BucketHeader{q.Headers, {{"api_key", "x-api-key"}, {"plan", "x-plan"}}} {
		q.Headers = headers
		d, err := Data(Options{NoWasm: true, RLQSPort: 7, RateLimitQuota: q})
		if err != nil {
			t.Fatal(err)
		}
		got, err := Render(Bootstrap, d)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal([]byte(got), &doc); err != nil {
			t.Fatalf("%v\n%s", err, got)
		}
		b, _ := json.Marshal(doc)
		wants := []string{`"name":"envoy.filters.http.rate_limit_quota"`, `"domain":"edge"`,
			`"rlqs_server":{"envoy_grpc":{"cluster_name":"rlqs"}}`, `"reporting_interval":"1.500s"`,
			`"no_assignment_behavior":{"fallback_rate_limit":{"blanket_rule":"DENY_ALL"}}`,
			`"expired_assignment_behavior":{"reuse_last_assignment":{}}`, `"http_status":{"code":429}`,
			`"api_key":{"custom_value":{"name":"x-api-key"`, `"http2_protocol_options":{"max_concurrent_streams":100}`,
			`"port_value":7`, `"google_re2":{}`}
		if len(headers) == 2 {
			wants = append(wants, `"and_matcher"`, `"plan":{"custom_value":{"name":"x-plan"`)
		}
		for _, want := range wants {
			if !strings.Contains(string(b), want) {
				t.Errorf("%d headers: want %s in\n%s", len(headers), want, got)
			}
		}
		if strings.Index(got, "rate_limit_quota") > strings.Index(got, "envoy.filters.http.router") {
			t.Errorf("the quota filter is not before the router:\n%s", got)
		}
	}
	for name, opts := range map[string]Options{
		"no RLQSPort":  {NoWasm: true, RateLimitQuota: &RateLimitQuota{Domain: "d", Headers: []BucketHeader{{"k", "h"}}}},
		"no domain":    {NoWasm: true, RLQSPort: 7, RateLimitQuota: &RateLimitQuota{Headers: []BucketHeader{{"k", "h"}}}},
		"no header":    {NoWasm: true, RLQSPort: 7, RateLimitQuota: &RateLimitQuota{Domain: "d"}},
		"a YAML key":   {NoWasm: true, RLQSPort: 7, RateLimitQuota: &RateLimitQuota{Domain: "d", Headers: []BucketHeader{{"k: x", "h"}}}},
		"a repeat":     {NoWasm: true, RLQSPort: 7, RateLimitQuota: &RateLimitQuota{Domain: "d", Headers: []BucketHeader{{"k", "h"}, {"k", "g"}}}},
		"microseconds": {NoWasm: true, RLQSPort: 7, RateLimitQuota: &RateLimitQuota{Domain: "d", Headers: []BucketHeader{{"k", "h"}}, ReportingInterval: time.Microsecond}},
		"a rule":       {NoWasm: true, RLQSPort: 7, RateLimitQuota: &RateLimitQuota{Domain: "d", Headers: []BucketHeader{{"k", "h"}}, NoAssignment: "SOME"}},
	} {
		if _, err := Data(opts); err == nil {
			t.Errorf("%s: Data accepted it", name)
		}
	}
}

// TestBootstrapUpstreamTLS: .Data.rls_tls and .Data.rlqs_tls put mutual
// TLS (the CA, a client certificate) on the clusters rls and rlqs, as
// Envoy Gateway's cluster to its rate limit service has; without them, the
// clusters are cleartext.
func TestBootstrapUpstreamTLS(t *testing.T) {
	files := map[string]any{"ca": "/certs/ca.crt", "cert": "/certs/tls.crt", "key": "/certs/tls.key"}
	for _, data := range []map[string]any{nil, {"rls_tls": files, "rlqs_tls": files}} {
		d, err := Data(Options{NoWasm: true, RLSPort: 5, RLQSPort: 6, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		got, err := Render(Bootstrap, d)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			StaticResources struct {
				Clusters []map[string]any `json:"clusters"`
			} `json:"static_resources"`
		}
		if err := yaml.Unmarshal([]byte(got), &doc); err != nil {
			t.Fatalf("%v\n%s", err, got)
		}
		if len(doc.StaticResources.Clusters) != 2 {
			t.Fatalf("clusters %v, want rls and rlqs", doc.StaticResources.Clusters)
		}
		for _, c := range doc.StaticResources.Clusters {
			b, _ := json.Marshal(c)
			socket := strings.Contains(string(b), `"transport_socket"`)
			switch {
			case data == nil && socket:
				t.Errorf("cluster %v without TLS data: %s", c["name"], b)
			case data != nil && (!socket || !strings.Contains(string(b), `"trusted_ca":{"filename":"/certs/ca.crt"}`) ||
				!strings.Contains(string(b), `"certificate_chain":{"filename":"/certs/tls.crt"}`)):
				t.Errorf("cluster %v with TLS data: %s", c["name"], b)
			}
		}
	}
}

// TestBootstrapRouteTimeout: the route's timeout is 15 s unless the
// listener (or Options, for the default one) sets RouteTimeout: a test that
// streams gigabytes through one worker sets a longer one, so a loaded
// machine makes it slower, not cut short (e2e's
// TestResponseBodiesInBoundedMemory saw its answers end at 15 s under load).
func TestBootstrapRouteTimeout(t *testing.T) {
	for _, tc := range []struct{ set, want string }{{"", "timeout: 15s"}, {"300s", "timeout: 300s"}} {
		d, err := Data(Options{NoWasm: true, UpstreamPort: 7, RouteTimeout: tc.set})
		if err != nil {
			t.Fatal(err)
		}
		got, err := Render(Bootstrap, d)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got, "route: {cluster: upstream, "+tc.want+"}") {
			t.Errorf("RouteTimeout %q: the route lacks %q:\n%s", tc.set, tc.want, got)
		}
	}
}
