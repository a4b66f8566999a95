// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// failurePolicies are the values of the Wasm filter's failure_policy that
// say what happens when the VM fails (Envoy 1.40: FAIL_RELOAD=1,
// FAIL_CLOSED=2, FAIL_OPEN=3); UNSPECIFIED leaves it to a default that
// Envoy's docs and code disagree on.
var failurePolicies = map[string]bool{"FAIL_RELOAD": true, "FAIL_CLOSED": true, "FAIL_OPEN": true}

// failOpenRE finds the deprecated field in YAML text, including the Envoy
// configurations that Go files embed as templates.
var failOpenRE = regexp.MustCompile(`(?m)^\s*fail_open:`)

// TestShippedWasmFiltersSetFailurePolicy: every Envoy configuration of the
// repository (YAML files, and templates embedded in Go files) sets the Wasm
// filter's failure_policy explicitly and never the deprecated fail_open.
//
// Wasm only: failure_policy is a field of the Wasm filter.
func TestShippedWasmFiltersSetFailurePolicy(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..")
	files, err := exec.Command("git", "-C", root, "ls-files", "*.yaml", "*.yml", "*.go").Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err)
	}
	wasmFilters := 0
	for _, f := range strings.Fields(string(files)) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			t.Fatal(err)
		}
		if loc := failOpenRE.FindIndex(b); loc != nil {
			t.Errorf("%s:%d: the deprecated fail_open; set failure_policy", f, bytes.Count(b[:loc[0]], []byte("\n"))+1)
		}
		if strings.HasSuffix(f, ".go") || !bytes.Contains(b, []byte(wasmType)) {
			continue
		}
		for _, doc := range bytes.Split(b, []byte("\n---\n")) {
			j, err := yaml.YAMLToJSON(doc)
			if err != nil {
				continue // a template, not YAML as it is
			}
			var tree any
			if err := json.Unmarshal(j, &tree); err != nil {
				continue
			}
			for _, c := range wasmFilterConfigs(tree) {
				wasmFilters++
				if p, _ := c["failure_policy"].(string); !failurePolicies[p] {
					t.Errorf("%s: Wasm filter %v: failure_policy %q, want one of FAIL_CLOSED, FAIL_OPEN, FAIL_RELOAD", f, c["name"], p)
				}
			}
		}
	}
	if wasmFilters == 0 {
		t.Fatal("no Wasm filter found in the repository's YAML files")
	}
	t.Logf("%d Wasm filters set failure_policy", wasmFilters)
}

// wasmFilterConfigs returns the config of every Wasm filter in a tree.
func wasmFilterConfigs(v any) []map[string]any {
	var out []map[string]any
	switch v := v.(type) {
	case map[string]any:
		if v["@type"] == wasmType {
			if c, ok := v["config"].(map[string]any); ok {
				out = append(out, c)
			}
		}
		for _, e := range v {
			out = append(out, wasmFilterConfigs(e)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, wasmFilterConfigs(e)...)
		}
	}
	return out
}
