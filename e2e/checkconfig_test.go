package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// TestCheckConfigMatchesEnvoy: for configurations the plugin refuses, the
// line `make lint` (cmd/checkconfig) prints is the line the real Envoy logs
// when it refuses the plugin. The cases are TestBadConfigurationRefused's
// and the parser's other kinds of refusal (invalid JSON, an unknown field,
// a relation between rules).
func TestCheckConfigMatchesEnvoy(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testCheckConfigMatchesEnvoy)
}

func testCheckConfigMatchesEnvoy(t *testing.T, build envoytest.Build) {
	envoytest.NeedsBuild(t, build)
	bin := filepath.Join(t.TempDir(), "checkconfig")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/checkconfig").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/checkconfig: %v\n%s", err, out)
	}
	for _, tt := range []struct{ name, config string }{
		{"burst below the rate", `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 10, "burst": 5}}]}`},
		{"invalid JSON", `{"rules": [`},
		{"unknown field", `{"rules": [{"name": "a", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 1}, "limit_key": ["header:k"]}]}`},
		{"two failure modes", `{"rules": [{"name": "a", "scope": "cluster", "service": {"cluster": "limit_service"}, "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 1, "burst": 2}}, {"name": "b", "scope": "cluster",
	  "service": {"cluster": "limit_service", "failure_mode": "deny"}, "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.json")
			if err := os.WriteFile(path, []byte(tt.config), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, path).Output()
			if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 1 {
				t.Fatalf("checkconfig: %v, want exit 1\n%s", err, out)
			}
			line, ok := strings.CutPrefix(strings.TrimSuffix(string(out), "\n"), "FAIL "+path+": ")
			if !ok || strings.Contains(line, "\n") {
				t.Fatalf("checkconfig printed %q, want one FAIL line for %s", out, path)
			}
			f := envoytest.ExpectStartFailure(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML, PluginConfig: tt.config, UpstreamPort: 1})
			if !strings.Contains(f.Log, line+"\n") {
				t.Fatalf("Envoy (%v) did not log checkconfig's line %q:\n%s", f, line, f.Log)
			}
			t.Logf("Envoy and checkconfig: %s", line)
		})
	}
}
