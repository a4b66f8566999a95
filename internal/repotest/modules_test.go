// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package repotest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// labOnly are modules only the benchmark lab (the module in bench/) uses:
// plots and process statistics. The root module, which users download to
// build the plugin or the service, requires none of them directly.
// gopsutil still reaches the root's build list through func-e's Go API
// (internal/testing/envoy), so it may stay there as an indirect requirement;
// gonum/plot must not appear at all.
var labOnly = map[string]bool{ // module path: allowed as // indirect
	"gonum.org/v1/plot":             false,
	"github.com/shirou/gopsutil/v4": true,
}

// TestLabDependenciesStayInTheLab: the root go.mod requires no module that
// only the benchmark lab needs, and the lab is a module of its own whose
// go.mod points back at this checkout.
func TestLabDependenciesStayInTheLab(t *testing.T) {
	root := filepath.Join("..", "..")
	reqs := requires(t, filepath.Join(root, "go.mod"))
	for mod, indirectOK := range labOnly {
		indirect, ok := reqs[mod]
		switch {
		case !ok:
		case !indirect:
			t.Errorf("go.mod requires %s directly: only the benchmark lab (bench/go.mod) may", mod)
		case !indirectOK:
			t.Errorf("go.mod requires %s (indirect): a root package reaches it; only the benchmark lab may", mod)
		}
	}
	lab := requires(t, filepath.Join(root, "bench", "go.mod"))
	for mod := range labOnly {
		if indirect, ok := lab[mod]; !ok || indirect {
			t.Errorf("bench/go.mod does not require %s directly (ok %v, indirect %v)", mod, ok, indirect)
		}
	}
	b, err := os.ReadFile(filepath.Join(root, "bench", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"module github.com/ratelimit-wasm/tokenbucket/bench\n",
		"replace github.com/ratelimit-wasm/tokenbucket => ../\n"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("bench/go.mod lacks %q", strings.TrimSpace(want))
		}
	}
}

// requires reads the require directives of the go.mod at path: module path
// to whether it is marked // indirect.
func requires(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	reqs := map[string]bool{}
	block := false
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "require (":
			block = true
			continue
		case block && line == ")":
			block = false
			continue
		case strings.HasPrefix(line, "require "):
			line = strings.TrimSpace(strings.TrimPrefix(line, "require "))
		case !block:
			continue
		}
		if f := strings.Fields(line); len(f) >= 2 {
			reqs[f[0]] = strings.HasSuffix(line, "// indirect")
		}
	}
	if len(reqs) == 0 {
		t.Fatalf("%s: no require directives", path)
	}
	return reqs
}
