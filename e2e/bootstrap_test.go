package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/envoytest"
)

// TestReadmeBootstrap checks the complete bootstrap README.md gives for
// your own Envoy: `envoy --mode validate` accepts it with the plugin loaded
// (validate mode starts the plugin and runs its parser), and refuses it
// when the plugin would refuse the configuration. (The demo's envoy.yaml is
// booted by TestExamples/quickstart.)
func TestReadmeBootstrap(t *testing.T) {
	envoytest.EnvoyBin(t) // skip locally, fail under CI=true, when there is none
	wasm := envoytest.PluginWasm(t)
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
	if !ok || !ok2 || !strings.Contains(bootstrap, "/etc/envoy/plugin.wasm") {
		t.Fatal("the section has no yaml block loading /etc/envoy/plugin.wasm")
	}
	bootstrap = strings.ReplaceAll(bootstrap, "/etc/envoy/plugin.wasm", wasm)
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
