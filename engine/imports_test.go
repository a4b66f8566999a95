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
