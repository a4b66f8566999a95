package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
)

// TestPrometheusNames checks the metric names the docs give each build
// against what Envoy really exports. Wasm (docs/responses.md): in /stats the
// plugin's counters are wasmcustom.tokenbucket.…; in /stats/prometheus Envoy
// drops its custom namespace "wasmcustom" and the envoy_ prefix, and writes
// dots and dashes as underscores: tokenbucket_rule_per_key_allowed{} 1.
// Native (docs/native.md): Envoy 1.40 registers no namespace of a dynamic
// module with its Prometheus output, whatever metrics_namespace says, so the
// names keep envoy_ and the namespace: envoy_dynamicmodulescustom_tokenbucket_….
func TestPrometheusNames(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testPrometheusNames)
}

// prometheusPrefix is what /stats/prometheus puts before tokenbucket_ for
// build's metrics (as its doc page says: nativePrometheusDoc).
func prometheusPrefix(build envoytest.Build) string {
	if build == envoytest.Native {
		return "envoy_dynamicmodulescustom_"
	}
	return ""
}

// nativePrometheusDoc is the sentence of docs/native.md that gives the native
// module's Prometheus names.
const nativePrometheusDoc = "as `envoy_dynamicmodulescustom_tokenbucket_…` in `/stats/prometheus`"

// startOneRejected starts Envoy of build (with the extra arguments extra)
// on the demo configuration with one per-key rule of burst 1, and sends it
// two requests of one key: one allowed, one rejected, both counted.
func startOneRejected(t *testing.T, build envoytest.Build, extra ...string) *envoytest.Envoy {
	t.Helper()
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML, UpstreamPort: up.Port(),
		Concurrency: 1, ExtraArgs: extra,
		PluginConfig: `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],
		  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 1}}]}`})
	c := e.Client()
	t.Cleanup(c.Close)
	c.Get("/", map[string]string{"x-api-key": "a"})
	c.Get("/", map[string]string{"x-api-key": "a"})
	e.WaitPluginStat("tokenbucket.rule.per-key.rejected", 1, 5e9)
	return e
}

func testPrometheusNames(t *testing.T, build envoytest.Build) {
	e := startOneRejected(t, build)
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
	prefix := prometheusPrefix(build)
	for _, want := range []string{
		"tokenbucket_rule_per_key_allowed{} 1", "tokenbucket_rule_per_key_rejected{} 1",
		"tokenbucket_rule_per_key_failed_open{} 0", "tokenbucket_rule_per_key_shadow_rejected{} 0",
		"tokenbucket_service_errors{} 0", "tokenbucket_evictions{} 0", "tokenbucket_cas_retries{} 0", "tokenbucket_refunds{} 0",
		"tokenbucket_regex_value_too_long{} 0", "tokenbucket_memory_gc_cycles{} ", "tokenbucket_memory_heap_bytes{} ",
	} {
		if !strings.Contains(text, "\n"+prefix+want) {
			t.Errorf("/stats/prometheus has no line %q", prefix+want)
		}
	}
	switch build {
	case envoytest.Wasm:
		if ns := "envoy_" + strings.TrimSuffix(build.StatPrefix(), "."); strings.Contains(text, ns) {
			t.Errorf("/stats/prometheus names a metric %s_…: the names of docs/responses.md are wrong", ns)
		}
	case envoytest.Native:
		doc, err := os.ReadFile("../docs/native.md")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(strings.Fields(string(doc)), " "), nativePrometheusDoc) {
			t.Errorf("docs/native.md does not say %q", nativePrometheusDoc)
		}
	}
}

// TestPrometheusRuleLabel boots the demo's envoy.yaml, whose stats_config
// turns the rule name into a Prometheus label (Envoy's tag extraction), and
// checks the names as users query them: tokenbucket_rule_allowed{rule="per-key"}
// in /stats/prometheus, the full wasmcustom.tokenbucket.rule.per-key.allowed
// in /stats. A second configuration gives a rule name with dots
// ("tier.gold"), which the tag keeps whole; a third gives the tag through
// the custom bootstrap docs/istio.md prescribes for Istio.
//
// Wasm only: the demo's envoy.yaml and Istio's bootstrap load the Wasm filter.
func TestPrometheusRuleLabel(t *testing.T) {
	t.Parallel()
	envoytest.Needs(t, true)
	ex := loadExample(t, "quickstart", "..")
	embedded, err := json.Marshal(ex.config)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ex.bootstrap, string(embedded)) {
		t.Fatal("the demo's bootstrap does not hold its configuration as one JSON string")
	}
	dotted, err := json.Marshal(`{"rules": [{"name": "tier.gold", "limit_keys": ["header:x-api-key"],
	  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.02, "burst": 5}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	// The custom bootstrap docs/istio.md gives Istio (its ConfigMap's
	// custom_bootstrap.json), merged over a bootstrap without stats_config
	// with --config-yaml, as pilot-agent hands it to Envoy.
	override := istioCustomBootstrap(t)
	for _, tt := range []struct {
		name, bootstrap, rule string
		args                  []string
	}{
		{name: "envoy.yaml", bootstrap: ex.bootstrap, rule: "per-key"},
		{name: "rule name with dots", bootstrap: strings.Replace(ex.bootstrap, string(embedded), string(dotted), 1), rule: "tier.gold"},
		{name: "stats_config merged by --config-yaml", bootstrap: envoytest.DemoConfigYAML, rule: "per-key",
			args: []string{"--config-yaml", override}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The demo answers from a listener of its own on UpstreamPort.
			opts := envoytest.Options{Config: tt.bootstrap, UpstreamPort: envoytest.FreePort(t), Concurrency: 1, ExtraArgs: tt.args}
			if tt.bootstrap == envoytest.DemoConfigYAML {
				up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
				opts.UpstreamPort = up.Port()
				opts.PluginConfig = ex.config
			}
			e := envoytest.Start(t, opts)
			c := e.Client()
			t.Cleanup(c.Close)
			for i := 0; i < 6; i++ { // burst 5: five allowed, one rejected
				c.Get("/", map[string]string{"x-api-key": "a"})
			}
			full := "wasmcustom.tokenbucket.rule." + tt.rule + "."
			e.WaitStat(full+"rejected", 1, 5e9)
			if got := e.Stat(full + "allowed"); got != 5 {
				t.Errorf("/stats %sallowed = %d, want 5", full, got)
			}
			text := adminGet(t, e, "/stats/prometheus")
			for _, want := range []string{
				"tokenbucket_rule_allowed{rule=\"" + tt.rule + "\"} 5",
				"tokenbucket_rule_rejected{rule=\"" + tt.rule + "\"} 1",
				"tokenbucket_rule_failed_open{rule=\"" + tt.rule + "\"} 0",
				"tokenbucket_rule_shadow_rejected{rule=\"" + tt.rule + "\"} 0",
				"# TYPE tokenbucket_rule_allowed counter",
				"tokenbucket_service_errors{} 0",
			} {
				if !strings.Contains(text, "\n"+want+"\n") {
					t.Errorf("/stats/prometheus has no line %q", want)
				}
			}
			if strings.Contains(text, "tokenbucket_rule_"+strings.NewReplacer("-", "_", ".", "_").Replace(tt.rule)) {
				t.Errorf("/stats/prometheus still names the rule in a metric name:\n%s", logtext.Grep(text, "tokenbucket_rule"))
			}
			t.Logf("/stats/prometheus:\n%s", logtext.Grep(text, "tokenbucket_rule"))
		})
	}
}

func adminGet(t *testing.T, e *envoytest.Envoy, path string) string {
	t.Helper()
	resp, err := http.Get(e.AdminURL(path))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// istioCustomBootstrap returns the custom_bootstrap.json of the ConfigMap in
// docs/istio.md.
func istioCustomBootstrap(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/istio.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "  custom_bootstrap.json: |\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/istio.md has no ConfigMap with custom_bootstrap.json")
	}
	var cm map[string]any
	if err := yaml.Unmarshal([]byte("data:\n  custom_bootstrap.json: |\n"+block), &cm); err != nil {
		t.Fatalf("docs/istio.md's ConfigMap: %v", err)
	}
	data, _ := cm["data"].(map[string]any)
	j, _ := data["custom_bootstrap.json"].(string)
	if !json.Valid([]byte(j)) {
		t.Fatalf("docs/istio.md's custom_bootstrap.json is not JSON: %q", j)
	}
	return j
}

// TestReadmeStatsTagsNative: README.md's bootstrap turns the rule name into
// a Prometheus label for the Wasm plugin's names; for the native module the
// README says to start the same regex with ^dynamicmodulescustom\. instead.
// Done so on the native module, the label is there.
func TestReadmeStatsTagsNative(t *testing.T) {
	t.Parallel()
	envoytest.NeedsBuild(t, envoytest.Native)
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const wasmStart, nativeStart = `^wasmcustom\.`, `^dynamicmodulescustom\.`
	if !strings.Contains(string(readme), "`"+nativeStart+"`") {
		t.Fatalf("README.md does not say to start the regex with %s for the native module", nativeStart)
	}
	var tree struct {
		StatsConfig struct {
			StatsTags []struct {
				TagName string `json:"tag_name"`
				Regex   string `json:"regex"`
			} `json:"stats_tags"`
		} `json:"stats_config"`
	}
	if err := yaml.Unmarshal([]byte(readmeBootstrap(t)), &tree); err != nil {
		t.Fatal(err)
	}
	if len(tree.StatsConfig.StatsTags) != 1 || !strings.HasPrefix(tree.StatsConfig.StatsTags[0].Regex, wasmStart) {
		t.Fatalf("README.md's bootstrap: stats_tags %+v, want one regex starting %s", tree.StatsConfig.StatsTags, wasmStart)
	}
	tag := tree.StatsConfig.StatsTags[0]
	override, err := json.Marshal(map[string]any{"stats_config": map[string]any{"stats_tags": []any{
		map[string]string{"tag_name": tag.TagName, "regex": nativeStart + strings.TrimPrefix(tag.Regex, wasmStart)}}}})
	if err != nil {
		t.Fatal(err)
	}
	e := startOneRejected(t, envoytest.Native, "--config-yaml", string(override))
	text := adminGet(t, e, "/stats/prometheus")
	for _, want := range []string{
		`envoy_dynamicmodulescustom_tokenbucket_rule_allowed{rule="per-key"} 1`,
		`envoy_dynamicmodulescustom_tokenbucket_rule_rejected{rule="per-key"} 1`,
	} {
		if !strings.Contains(text, "\n"+want+"\n") {
			t.Errorf("/stats/prometheus has no line %q:\n%s", want, logtext.Grep(text, "tokenbucket_rule"))
		}
	}
}
