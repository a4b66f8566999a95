package filter

import (
	"testing"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/requestpath"
)

// TestRequestPathNative: what one allowed request runs through in the
// native module (a key's second), from OnRequestHeaders to its Continue (the Wasm plugin's
// is internal/testing/requestpath's TestRequestPathWasm).
func TestRequestPathNative(t *testing.T) {
	_, c := newConfig(t, `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 20}}]}`)
	first := &filterHandle{req: newHeaders(map[string][]string{":path": {"/"}, "x-api-key": {"a"}}), resp: newHeaders(nil)}
	c.Create(first).OnRequestHeaders(first.req, false) // the key's first request
	h := &filterHandle{req: newHeaders(map[string][]string{":path": {"/"}, "x-api-key": {"a"}}), resp: newHeaders(nil)}
	f := c.Create(h).(*httpFilter)
	p := requestpath.Measure(t, func() {
		if st := f.OnRequestHeaders(h.req, false); st != shared.HeadersStatusContinue {
			t.Errorf("the request was not allowed: %v", st)
		}
	})
	t.Logf("one allowed request on the native module: %v", p)
}
