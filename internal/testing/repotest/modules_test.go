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
// build the plugin or the service, requires none of them, not even
// indirectly (go.sum may still list them: it records what `go mod tidy`
// checked, not what a build downloads).
var labOnly = []string{"gonum.org/v1/plot", "github.com/shirou/gopsutil/v4"}

// notAModule are tools the project runs as programs, never links: func-e's
// CLI starts every Envoy (`make setup` installs it at a pinned version), so
// its Go module, which brings gopsutil, is in no go.mod of the repository.
var notAModule = []string{"github.com/tetratelabs/func-e"}

// TestLabDependenciesStayInTheLab: the root go.mod requires no module that
// only the benchmark lab needs, nor func-e's Go module, and the lab is a
// module of its own whose go.mod points back at this checkout.
func TestLabDependenciesStayInTheLab(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	reqs := requires(t, filepath.Join(root, "go.mod"))
	for _, mod := range labOnly {
		if indirect, ok := reqs[mod]; ok {
			t.Errorf("go.mod requires %s (indirect %v): a root package reaches it; only the benchmark lab (bench/go.mod) may", mod, indirect)
		}
	}
	lab := requires(t, filepath.Join(root, "bench", "go.mod"))
	for name, gomod := range map[string]map[string]bool{"go.mod": reqs, "bench/go.mod": lab} {
		for _, mod := range notAModule {
			if _, ok := gomod[mod]; ok {
				t.Errorf("%s requires %s: it is run as a program (`make setup` installs it), not linked", name, mod)
			}
		}
	}
	for _, mod := range labOnly {
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
