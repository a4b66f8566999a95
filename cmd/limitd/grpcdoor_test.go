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
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// --token-file's front proxy and its identities, and --identity-header,
// reach the gRPC door: the proxy's token alone, or with an identity not in
// the file, is Unauthenticated; with a listed identity the call is that
// identity's (counted under its name).
func TestRunGRPCFrontProxy(t *testing.T) {
	srv := redistest.Start(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("edge ptok front-proxy\nteam-a identity spiffe://a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, logs, cancel, done := start(t, []string{"--listen", "127.0.0.1:0", "--redis", srv.Addr(), "--token-file", tokens,
		"--identity-header", "X-Client-Identity", "--grpc-listen", "127.0.0.1:0", "--rls-config", writeConfig(t, rlsYAML)}, env())
	conn := dialGRPC(t, grpcAddr(t, logs))
	ctx, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	c := pb.NewRateLimitServiceClient(conn)
	req := &pb.RateLimitRequest{Domain: "apis", Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "other"}}}}}
	for name, md := range map[string][]string{
		"the proxy's token alone":     {"authorization", "Bearer ptok"},
		"an identity not in the file": {"authorization", "Bearer ptok", "x-client-identity", "spiffe://b"},
	} {
		// Each on a connection of its own: the door closes a connection
		// refused for its credentials within a second, calls in flight and all.
		anon := pb.NewRateLimitServiceClient(dialGRPC(t, grpcAddr(t, logs)))
		if _, err := anon.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx, md...), req); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
	}
	if _, err := c.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer ptok", "x-client-identity", "spiffe://a"), req,
		grpc.WaitForReady(true)); err != nil {
		t.Fatalf("a listed identity: %v", err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `limitd_rls_authorized_calls_total{caller="team-a"} 1`; !strings.Contains(string(m), want) {
		t.Errorf("/metrics lacks %s", want)
	}
	stopRun(t, cancel, done)
}
