package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
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
func TestReadmeBootstrap(t *testing.T) {
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
