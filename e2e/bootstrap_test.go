package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
)

// readmeWasmPath is the plugin's path in README.md's bootstrap: the one
// thing its text tells the user to fill in.
const readmeWasmPath = "build/plugin.wasm"

// TestReadmeBootstrap checks the complete bootstrap README.md gives for
// your own Envoy, as written but for the plugin's path: it has an admin
// block (the README reads /stats from it), names readmeWasmPath exactly
// once, and `envoy --mode validate` accepts it with the plugin loaded
// (validate mode starts the plugin and runs its parser) and refuses it when
// the plugin would refuse the configuration. (The demo's envoy.yaml is
// booted by TestExamples/quickstart.)
//
// Wasm only: README.md's bootstrap loads the Wasm filter.
func TestReadmeBootstrap(t *testing.T) {
	t.Parallel()
	bootstrap := readmeBootstrap(t)
	if n := strings.Count(bootstrap, readmeWasmPath); n != 1 {
		t.Fatalf("the bootstrap names %s %d times, want once (the path the user fills in)", readmeWasmPath, n)
	}
	if !strings.HasPrefix(bootstrap, "admin:\n") && !strings.Contains(bootstrap, "\nadmin:\n") {
		t.Fatal("the bootstrap has no admin block: the README's /stats would not answer")
	}
	envoytest.EnvoyBin(t) // skip locally, fail under CI=true, when there is none
	wasm := envoytest.PluginWasm(t)
	bootstrap = strings.Replace(bootstrap, readmeWasmPath, wasm, 1)
	validate := func(cfg string) (string, error) {
		path := filepath.Join(t.TempDir(), "envoy.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		return envoy.Validate(path)
	}
	if out, err := validate(bootstrap); err != nil {
		t.Fatalf("envoy --mode validate refuses the README's bootstrap: %v\n%s", err, out)
	}
	bad := strings.Replace(bootstrap, `"tokens_per_second": 10, "burst": 50`, `"tokens_per_second": 10, "burst": 5`, 1)
	out, err := validate(bad)
	if err == nil || !strings.Contains(out, "rules[0].algorithm_config.burst: must be >= tokens_per_second (10), got 5") {
		t.Fatalf("a configuration the plugin refuses passed validation (err %v):\n%s", err, out)
	}
}

// readmeBootstrap is the yaml block of README.md's section for your own
// Envoy.
func readmeBootstrap(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "## Using the plugin in your own Envoy")
	if !ok {
		t.Fatal("README.md has no section \"Using the plugin in your own Envoy\"")
	}
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	bootstrap, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("the section has no yaml block")
	}
	return bootstrap
}

// readmeBackendPort is the backend's port in README.md's bootstrap.
const readmeBackendPort = "port_value: 8080"

// TestReadmeBootstrapServes boots README.md's bootstrap on real Envoy, as
// written but for free ports (its listener, admin and backend ports) and
// the plugin's path, sends one request more than its burst, and reads what
// the README says to read: the plugin's counters in the admin's /stats
// (`curl localhost:9901/stats`), and, as the bootstrap's stats_tags comment
// says, the rule name as a Prometheus label in /stats/prometheus.
//
// Wasm only: README.md's bootstrap loads the Wasm filter.
func TestReadmeBootstrapServes(t *testing.T) {
	t.Parallel()
	envoytest.Needs(t, true)
	bootstrap := readmeBootstrap(t)
	if n := strings.Count(bootstrap, readmeBackendPort); n != 1 {
		t.Fatalf("the bootstrap has %d %q, want the backend's once", n, readmeBackendPort)
	}
	// The examples' ports: 10000 listener, 9901 admin, 10001 upstream.
	var tree any
	if err := yaml.Unmarshal([]byte(strings.Replace(bootstrap, readmeBackendPort, "port_value: 10001", 1)), &tree); err != nil {
		t.Fatalf("the README's bootstrap: %v", err)
	}
	tmpl, err := exampleTemplate(tree)
	if err != nil {
		t.Fatalf("the README's bootstrap: %v", err)
	}
	const burst = 50 // "algorithm_config": {"tokens_per_second": 10, "burst": 50}
	if !strings.Contains(bootstrap, `"burst": 50}`) {
		t.Fatalf("the bootstrap's rule has no burst %d", burst)
	}
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Config: tmpl, UpstreamPort: up.Port(), Concurrency: 1})
	c := e.Client()
	t.Cleanup(c.Close)
	// Requests with one key until the first 429: at least the burst are
	// allowed, more when tokens refill (10 a second) in between. Bounded:
	// 4 × the burst come through only if they take over 15 s.
	allowed := 0
	for rejected := false; !rejected; {
		switch r := c.Get("/", map[string]string{"x-api-key": "a"}); r.Status {
		case 200:
			allowed++
			if allowed > 4*burst {
				t.Fatalf("%d requests with one x-api-key allowed, none rejected", allowed)
			}
		case 429:
			rejected = true
		default:
			t.Fatalf("after %d allowed: %v, want 200 or 429", allowed, r)
		}
	}
	if allowed < burst {
		t.Fatalf("%d requests allowed before the first 429, want at least the burst, %d", allowed, burst)
	}
	e.WaitStat("wasmcustom.tokenbucket.rule.per-key.rejected", 1, 5e9)
	stats := adminGet(t, e, "/stats")
	for _, want := range []string{
		"wasmcustom.tokenbucket.rule.per-key.allowed: " + strconv.Itoa(allowed),
		"wasmcustom.tokenbucket.rule.per-key.rejected: 1",
	} {
		if !strings.Contains(stats, "\n"+want+"\n") {
			t.Errorf("/stats has no line %q:\n%s", want, logtext.Grep(stats, "tokenbucket"))
		}
	}
	prom := adminGet(t, e, "/stats/prometheus")
	for _, want := range []string{`tokenbucket_rule_allowed{rule="per-key"} ` + strconv.Itoa(allowed), `tokenbucket_rule_rejected{rule="per-key"} 1`} {
		if !strings.Contains(prom, "\n"+want+"\n") {
			t.Errorf("/stats/prometheus has no line %q:\n%s", want, logtext.Grep(prom, "tokenbucket_rule"))
		}
	}
}
