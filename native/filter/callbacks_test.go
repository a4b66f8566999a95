package filter

import (
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
)

// TestMissingCallbacks reads the built module's imported Envoy callbacks:
// with every one present nothing is missing; without the config-level
// counter call (absent from Envoy 1.38) exactly that one is, and the line
// names it and the Envoy floor.
func TestMissingCallbacks(t *testing.T) {
	p := os.Getenv("NATIVE_MODULE")
	if p == "" {
		p = filepath.Join("..", "..", "build", "libtokenbucket.so")
	}
	f, err := elf.Open(p)
	if err != nil {
		ci.Skip(t, "%s: %v (make build-native)", p, err)
	}
	defer f.Close()
	var imported []string
	if _, err := missingCallbacks(f, func(name string) bool { imported = append(imported, name); return true }); err != nil {
		t.Fatal(err)
	}
	if len(imported) < 50 {
		t.Fatalf("the module imports %d Envoy callbacks, want the SDK's and ours (more than 50)", len(imported))
	}
	const counter = "envoy_dynamic_module_callback_http_filter_config_increment_counter"
	missing, err := missingCallbacks(f, func(name string) bool { return name != counter })
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || missing[0] != counter {
		t.Fatalf("missing = %q, want [%s]", missing, counter)
	}
	line := errMissingCallbacks(missing)
	if !strings.Contains(line, counter) || !strings.Contains(line, "Envoy 1.39 or later") || !strings.HasPrefix(line, Name+": refusing to start") {
		t.Errorf("line %q", line)
	}
}
