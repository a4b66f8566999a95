package rls

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/service"
)

// A front proxy's token is a ShouldRateLimit caller only with the identity
// it forwards (the identity header, as gRPC metadata), one of the token
// file's, and the call is counted as that identity's: without one, or with
// one removed from the file, it is refused Unauthenticated, as the HTTP API
// refuses the call.
func TestFrontProxyNeedsIdentity(t *testing.T) {
	c := newClock(epoch)
	f := start(t, basicYAML, fixtureOpts{store: memory(c), now: c.Now,
		tokens:         []service.Token{{Name: "proxy", Value: "proxy-secret", FrontProxy: true}},
		identities:     []service.Identity{{Name: "team-a", Value: "spiffe://a"}},
		identityHeader: "X-Client-Identity",
	})
	for name, md := range map[string][]string{
		"no identity":                 {"authorization", "Bearer proxy-secret"},
		"an identity not in the file": {"authorization", "Bearer proxy-secret", "x-client-identity", "spiffe://gone"},
		"two identities":              {"authorization", "Bearer proxy-secret", "x-client-identity", "spiffe://a", "x-client-identity", "spiffe://a"},
	} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), md...)
		if _, err := f.try(ctx, request("apis", desc("generic_key", "slow"))); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer proxy-secret", "x-client-identity", "spiffe://a")
	if _, err := f.try(ctx, request("apis", desc("generic_key", "slow"))); err != nil {
		t.Fatalf("the identity in the file: %v", err)
	}
	if got := f.counter("limitd_rls_authorized_calls_total", map[string]string{"caller": "team-a"}); got != 1 {
		t.Errorf("team-a's calls %v, want 1", got)
	}
}
