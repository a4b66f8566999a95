package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

func TestRunRLQSFlagErrors(t *testing.T) {
	good := writeConfig(t, rlsYAML)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rlqs-unmatched", "maybe"}, "--rlqs-unmatched: want allow or deny"},
		{[]string{"--rlqs-ttl", "500ms"}, "--rlqs-ttl: must be >= 1s"},
		{[]string{"--rlqs-abandon-after", "0s"}, "--rlqs-abandon-after: must be > 0"},
		{[]string{"--rlqs-replicas", "0"}, "--rlqs-replicas: must be >= 1"},
		{[]string{"--rlqs-shutdown", "later"}, "--rlqs-shutdown: want keep or abandon"},
	} {
		args := append([]string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--rls-config", good}, tc.args...)
		err := run(context.Background(), args, env(), io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// limitd on a real Redis serves the rate limit quota service on
// --grpc-listen beside the rate limit service, with the same token: what a
// quota stream reports allowed is taken from the very bucket ShouldRateLimit
// decides for the same descriptor, and at shutdown the stream is told its
// assignments stand and ends Unavailable while run returns nil.
func TestRunRLQSRedis(t *testing.T) {
	srv := redistest.Start(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("gw-1 tok1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, logs, cancel, done := start(t, []string{"--listen", "127.0.0.1:0", "--redis", srv.Addr(), "--token-file", tokens,
		"--grpc-listen", "127.0.0.1:0", "--rls-config", writeConfig(t, rlsYAML)}, env())
	conn := dialGRPC(t, grpcAddr(t, logs))
	ctx, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok1")
	q, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(actx)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "apis", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqspb.BucketId{Bucket: map[string]string{"generic_key": "slow"}}, NumRequestsAllowed: 1,
	}}}); err != nil {
		t.Fatal(err)
	}
	r, err := q.Recv()
	if err != nil {
		t.Fatalf("recv: %v\n%s", err, logs)
	}
	tb := r.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || tb.MaxTokens != 1 {
		t.Fatalf("assignment %v, want a token bucket of max_tokens 1 (of the limit's 2)", r)
	}
	// The quota stream's reported request is taken from the bucket
	// ShouldRateLimit decides for the same descriptor: one left, not two.
	c := pb.NewRateLimitServiceClient(conn)
	req := &pb.RateLimitRequest{Domain: "apis", Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "slow"}}}}}
	var got []pb.RateLimitResponse_Code
	for range 2 {
		r, err := c.ShouldRateLimit(actx, req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.OverallCode)
	}
	if got[1] != pb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("ShouldRateLimit after a quota stream reported a request: %v, want the second OVER_LIMIT", got)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"limitd_rlqs_streams 1", "limitd_rlqs_reports_total 1", "limitd_rlqs_leased_tokens_total",
		"limitd_rlqs_responses_total 1", "limitd_rlqs_assignments_total 1"} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	cancel()
	if _, err := q.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "until their TTL") {
		t.Errorf("the quota stream at shutdown: %v, want Unavailable (assignments stand)", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return")
	}
}
