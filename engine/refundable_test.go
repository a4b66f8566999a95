package engine_test

import (
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// TestDecideRefundable: a cluster decision says its bucket is refundable
// exactly when its rule can give back part of its cost after the response
// (cost_source from the response, or charge_on); a fixed-cost per-request
// rule sends none, so the service records nothing a refund could take.
func TestDecideRefundable(t *testing.T) {
	for _, tc := range []struct {
		name, extra, algo string
		want              bool
	}{
		{"fixed cost", "", `{"tokens_per_second": 1, "burst": 9}`, false},
		{"cost from a response header", "", `{"tokens_per_second": 1, "burst": 9, "cost_source": "response_header:x-usage"}`, true},
		{"charge_on", `"charge_on": ["2xx"], `, `{"tokens_per_second": 1, "burst": 9}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := `{"service": {"cluster": "limitd"}, "rules": [
			  {"name": "fleet", "scope": "cluster", ` + tc.extra + `"algorithm": "token_bucket", "algorithm_config": ` + tc.algo + `}]}`
			p := newPlugin(t, fakehost.New(), cfg)
			s := newStream()
			if a := p.NewRequest(s).OnRequestHeaders(); a != engine.Pause || len(s.Calls) != 1 {
				t.Fatalf("action %v with %d calls; want a pause on one call", a, len(s.Calls))
			}
			req, err := wire.DecodeRequest(s.Calls[0].Call.Body, wire.Limits{})
			if err != nil {
				t.Fatalf("the call's body: %v", err)
			}
			if got := req.Buckets[0].Refundable; got != tc.want {
				t.Fatalf("refundable %v, want %v (body %s)", got, tc.want, s.Calls[0].Call.Body)
			}
		})
	}
}
