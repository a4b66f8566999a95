package rlqs

import (
	"context"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/service"
)

// A front proxy's token opens a quota stream only with the identity it
// forwards (the identity header, as gRPC metadata), one of the token
// file's: without one, or with one removed from the file, the stream is
// refused Unauthenticated, as the HTTP API refuses the call.
func TestFrontProxyNeedsIdentity(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{
		tokens:         []service.Token{{Name: "proxy", Value: "proxy-secret", FrontProxy: true}},
		identities:     []service.Identity{{Name: "team-a", Value: "spiffe://a"}},
		identityHeader: "X-Client-Identity",
	})
	report := &rlqspb.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{"api_key": "k"}, 1, 0, time.Second)}}
	first := func(md ...string) error {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), md...), streamBound)
		defer cancel()
		s, err := rlqspb.NewRateLimitQuotaServiceClient(f.conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			return err
		}
		_ = s.Send(report) // an error shows at Recv
		_, err = s.Recv()
		return err
	}
	for name, md := range map[string][]string{
		"no identity":                   {"authorization", "Bearer proxy-secret"},
		"an identity not in the file":   {"authorization", "Bearer proxy-secret", "x-client-identity", "spiffe://gone"},
		"an identity without the token": {"x-client-identity", "spiffe://a"},
	} {
		if err := first(md...); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
	}
	if err := first("authorization", "Bearer proxy-secret", "x-client-identity", "spiffe://a"); err != nil {
		t.Errorf("the identity in the file: %v", err)
	}
}
