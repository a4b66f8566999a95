package e2e

import (
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// forEachBuild runs test once per build of the plugin, as the subtests
// "wasm" (build/plugin.wasm in Envoy's Wasm filter) and "native"
// (build/libtokenbucket.so in Envoy's dynamic modules filter), with the same
// configuration and the same checks: the two builds are one product. A
// build that is missing skips its subtest locally and fails it under
// CI=true. Cases that only the Wasm build can have (the Wasm VM's memory
// and garbage collector, V8, the Wasm filter's failure_policy, Istio's
// WasmPlugin, OCI images, shipped configurations that load the Wasm filter)
// stay Wasm-only, each with its reason.
func forEachBuild(t *testing.T, test func(t *testing.T, build envoytest.Build)) {
	for _, b := range envoytest.Builds {
		t.Run(b.String(), func(t *testing.T) { test(t, b) })
	}
}
