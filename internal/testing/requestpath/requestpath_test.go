package requestpath_test

import (
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/requestpath"
	"github.com/ratelimit-wasm/tokenbucket/plugin"
)

// OneRule is the configuration of the measured request: one local rule
// keyed by a header.
const OneRule = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 20}}]}`

// wasmRequest starts the plugin under the SDK's emulator, sends a key's
// first request, and returns the second one's context and headers.
func wasmRequest(t *testing.T) (proxytest.HostEmulator, uint32, [][2]string) {
	t.Helper()
	host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().WithVMContext(plugin.NewVMContext()).
		WithPluginConfiguration([]byte(OneRule)))
	t.Cleanup(reset)
	if st := host.StartPlugin(); st != types.OnPluginStartStatusOK {
		t.Fatalf("StartPlugin = %v: %v", st, host.GetCriticalLogs())
	}
	headers := [][2]string{{":path", "/"}, {"x-api-key", "a"}}
	host.CallOnRequestHeaders(host.InitializeHttpContext(), headers, false) // the key's first request
	return host, host.InitializeHttpContext(), headers
}

// TestRequestPathWasm: what one allowed request runs through in the Wasm
// plugin (a key's second), from OnHttpRequestHeaders to its Continue (the
// native module's is native/filter's TestRequestPathNative).
func TestRequestPathWasm(t *testing.T) {
	host, id, headers := wasmRequest(t)
	p := requestpath.Measure(t, func() {
		if a := host.CallOnRequestHeaders(id, headers, false); a != types.ActionContinue {
			t.Errorf("the request was not allowed: %v", a)
		}
	})
	t.Logf("one allowed request on the Wasm plugin: %v", p)
	p.Within(t, requestpath.Ceiling{Files: 16, Calls: 14, Hops: 6})
}

// TestRequestPathWasmWhole: the same request from its request headers to
// its end: its response's headers (the rate-limit headers added) and its
// context's completion.
func TestRequestPathWasmWhole(t *testing.T) {
	host, id, headers := wasmRequest(t)
	p := requestpath.Measure(t, func() {
		if a := host.CallOnRequestHeaders(id, headers, false); a != types.ActionContinue {
			t.Errorf("the request was not allowed: %v", a)
		}
		host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
		host.CompleteHttpContext(id)
	})
	t.Logf("one allowed request on the Wasm plugin, to its end: %v", p)
	p.Within(t, requestpath.Ceiling{Files: 19, Calls: 17, Hops: 6})
}
