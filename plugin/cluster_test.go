package plugin

import (
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// TestPluginCallOutlivesTheRequest: a call the plugin owns (a shadow-only
// cluster rule's) is sent from the plugin context, not the request's, so
// that its answer is delivered after the request has ended.
func TestPluginCallOutlivesTheRequest(t *testing.T) {
	e := start(t, `{"service": {"cluster": "limit_service"}, "rules": [{"name": "trial", "mode": "shadow", "scope": "cluster",
	  "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`)
	id := e.host.InitializeHttpContext()
	if a := e.host.CallOnRequestHeaders(id, requestHeaders([]string{"k", "a"}), false); a != types.ActionContinue {
		t.Fatalf("action %v: a shadow-only cluster rule paused the request", a)
	}
	if len(e.host.GetCalloutAttributesFromContext(id)) != 0 {
		t.Fatal("the request owns the shadow call: its answer would be lost once the request ends")
	}
	calls := e.host.GetCalloutAttributesFromContext(proxytest.PluginContextID)
	if len(calls) != 1 || !strings.Contains(string(calls[0].Body), `"shadow":true`) {
		t.Fatalf("plugin context's callouts %+v, want one with a shadow bucket", calls)
	}
	e.host.CompleteHttpContext(id) // the request ends before the answer
	e.host.CallOnHttpCallResponse(calls[0].CalloutID, [][2]string{{":status", "200"}}, nil,
		[]byte(`{"allowed":true,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":500,"reset_ms":2000}]}`))
	if e.counter("rule.trial.shadow_rejected") != 1 {
		t.Fatalf("shadow_rejected = %d, want 1", e.counter("rule.trial.shadow_rejected"))
	}
}
