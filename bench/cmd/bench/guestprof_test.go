// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
)

// TestGuestHostStubsEveryImport: guestprof/host.js (make bench-guest) stubs
// every function the built plugin imports, so V8 can instantiate it. A
// missing stub makes the run fail with a LinkError before any request.
func TestGuestHostStubsEveryImport(t *testing.T) {
	path := os.Getenv("PLUGIN_WASM")
	if path == "" {
		path = filepath.Join("..", "..", "..", "build", "plugin.wasm")
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		ci.Skip(t, "no plugin: %v (run make build)", err)
	}
	js, err := os.ReadFile(filepath.Join("guestprof", "host.js"))
	if err != nil {
		t.Fatal(err)
	}
	stubs := map[string]map[string]bool{ // import module: function names
		"env":                    jsObjectKeys(t, string(js), "env"),
		"wasi_snapshot_preview1": jsObjectKeys(t, string(js), "wasi"),
	}
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	m, err := r.CompileModule(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	imports := 0
	for _, f := range m.ImportedFunctions() {
		mod, name, _ := f.Import()
		imports++
		if !stubs[mod][name] {
			t.Errorf("guestprof/host.js has no stub for %s.%s, which %s imports", mod, name, path)
		}
	}
	if imports == 0 {
		t.Fatalf("%s imports no function: not the plugin?", path)
	}
}

// jsObjectKeys returns the property names of the object literal assigned by
// `const name = { ... };` in src: the names before a colon at the start of
// a line or after '{' or ','.
func jsObjectKeys(t *testing.T, src, name string) map[string]bool {
	t.Helper()
	start := strings.Index(src, "const "+name+" = {")
	if start < 0 {
		t.Fatalf("host.js: no `const %s = {`", name)
	}
	body, _, ok := strings.Cut(src[start:], "\n};")
	if !ok {
		t.Fatalf("host.js: `const %s` does not end with a line `};`", name)
	}
	keys := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)(?:^|[{,])\s*([A-Za-z_][A-Za-z0-9_]*)\s*:`).FindAllStringSubmatch(body, -1) {
		keys[m[1]] = true
	}
	return keys
}
