package engine

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNoHostSDK: the engine and everything it imports name no host SDK
// (proxy-wasm's, Envoy's dynamic modules'): a host reaches it only through
// Host and Stream.
func TestNoHostSDK(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("go list: %v", err)
		}
		t.Skipf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		for _, sdk := range []string{"proxy-wasm-go-sdk", "envoyproxy/envoy", "func-e"} {
			if strings.Contains(d, sdk) {
				t.Errorf("the engine depends on %s (a host SDK)", d)
			}
		}
	}
	if len(deps) < 10 {
		t.Fatalf("go list -deps printed %d packages: %v", len(deps), deps)
	}
}

// TestTreeByImports: the adapters (plugin, native/filter) import of this
// module only the engine, and what lives under engine/ (store, lease,
// slots, jsonpath) is imported only from beneath engine/ and by test
// helpers (internal/testing/).
func TestTreeByImports(t *testing.T) {
	const module = "github.com/ratelimit-wasm/tokenbucket"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, imports := f[0], f[1:]
		for _, imp := range imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			switch {
			case (pkg == module+"/plugin" || pkg == module+"/native/filter") && imp != module+"/engine":
				t.Errorf("%s imports %s: an adapter sees only the engine", pkg, imp)
			case strings.HasPrefix(imp, module+"/engine/") && !strings.HasPrefix(pkg, module+"/engine") &&
				!strings.HasPrefix(pkg, module+"/internal/testing/"):
				t.Errorf("%s imports %s, which only the engine uses", pkg, imp)
			}
		}
	}
}
