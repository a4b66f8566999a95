package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/envoytest"
)

// TestPrometheusNames checks the metric names docs/responses.md documents against
// what Envoy really exports: in /stats the plugin's counters are
// wasmcustom.tokenbucket.…; in /stats/prometheus Envoy drops its custom
// namespace "wasmcustom" and the envoy_ prefix, and writes dots and dashes as
// underscores: tokenbucket_rule_per_key_allowed{} 1.
func TestPrometheusNames(t *testing.T) {
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Config: envoytest.DemoConfigYAML, UpstreamPort: up.Port(), Concurrency: 1,
		PluginConfig: `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],
		  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 1}}]}`})
	c := e.Client()
	t.Cleanup(c.Close)
	c.Get("/", map[string]string{"x-api-key": "a"})
	c.Get("/", map[string]string{"x-api-key": "a"})
	e.WaitStat("wasmcustom.tokenbucket.rule.per-key.rejected", 1, 5e9)
	resp, err := http.Get(e.AdminURL("/stats/prometheus"))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)
	for _, want := range []string{
		"tokenbucket_rule_per_key_allowed{} 1", "tokenbucket_rule_per_key_rejected{} 1",
		"tokenbucket_rule_per_key_failed_open{} 0", "tokenbucket_rule_per_key_shadow_rejected{} 0",
		"tokenbucket_service_errors{} 0", "tokenbucket_evictions{} 0", "tokenbucket_cas_retries{} 0", "tokenbucket_refunds{} 0",
		"tokenbucket_regex_value_too_long{} 0", "tokenbucket_memory_gc_cycles{} ", "tokenbucket_memory_heap_bytes{} ",
	} {
		if !strings.Contains(text, "\n"+want) {
			t.Errorf("/stats/prometheus has no line %q", want)
		}
	}
	if strings.Contains(text, "envoy_wasmcustom") {
		t.Error("/stats/prometheus names a metric envoy_wasmcustom_…: the names of docs/responses.md are wrong")
	}
}
