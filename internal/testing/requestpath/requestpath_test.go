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

// TestRequestPathWasm: what one allowed request runs through in the Wasm
// plugin (a key's second), from OnHttpRequestHeaders to its Continue (the native module's
// is native/filter's TestRequestPathNative).
func TestRequestPathWasm(t *testing.T) {
	host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().WithVMContext(plugin.NewVMContext()).
		WithPluginConfiguration([]byte(OneRule)))
	defer reset()
	if st := host.StartPlugin(); st != types.OnPluginStartStatusOK {
		t.Fatalf("StartPlugin = %v: %v", st, host.GetCriticalLogs())
	}
	headers := [][2]string{{":path", "/"}, {"x-api-key", "a"}}
	host.CallOnRequestHeaders(host.InitializeHttpContext(), headers, false) // the key's first request
	id := host.InitializeHttpContext()
	p := requestpath.Measure(t, func() {
		if a := host.CallOnRequestHeaders(id, headers, false); a != types.ActionContinue {
			t.Errorf("the request was not allowed: %v", a)
		}
	})
	t.Logf("one allowed request on the Wasm plugin: %v", p)
}
