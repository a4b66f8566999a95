package main

import (
	"context"
	"flag"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/testpki"
)

// tlsFiles makes a CA, limitd's server certificate and a client's ("envoy")
// in a temporary folder.
func tlsFiles(t *testing.T) (ca *testpki.CA, cert, key, clientCert, clientKey string) {
	t.Helper()
	now := time.Now()
	ca, err := testpki.NewCA(t.TempDir(), "ca", now)
	if err != nil {
		t.Fatal(err)
	}
	if cert, key, err = ca.Issue("limitd", testpki.Loopback("limitd"), now); err != nil {
		t.Fatal(err)
	}
	if clientCert, clientKey, err = ca.Issue("envoy", testpki.Leaf{CN: "envoy", DNS: []string{"*.envoy-gateway-system"}}, now); err != nil {
		t.Fatal(err)
	}
	return ca, cert, key, clientCert, clientKey
}

func TestRunGRPCTLSFlagErrors(t *testing.T) {
	good := writeConfig(t, rlsYAML)
	ca, cert, key, _, _ := tlsFiles(t)
	grpc := []string{"--grpc-listen", "127.0.0.1:0", "--rls-config", good}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(grpc, "--grpc-tls-cert", cert), "--grpc-tls-cert: needs --grpc-tls-key"},
		{append(grpc, "--grpc-tls-key", key), "--grpc-tls-key: needs --grpc-tls-cert"},
		{append(grpc, "--grpc-tls-client-ca", ca.File), "--grpc-tls-client-ca: needs --grpc-tls-cert and --grpc-tls-key"},
		{append(grpc, "--grpc-tls-cert", cert, "--grpc-tls-key", key, "--grpc-tls-client-san", "envoy"), "--grpc-tls-client-san: needs --grpc-tls-client-ca"},
		{[]string{"--grpc-tls-cert", cert, "--grpc-tls-key", key}, "--grpc-tls-cert: needs --grpc-listen"},
		{append(grpc, "--grpc-tls-cert", key, "--grpc-tls-key", key), "--grpc-tls-cert"},
		{append(grpc, "--grpc-tls-cert", cert, "--grpc-tls-key", key, "--grpc-tls-client-ca", key), "--grpc-tls-client-ca"},
	} {
		args := append([]string{"--listen", "127.0.0.1:0"}, tc.args...)
		err := run(context.Background(), args, env(), io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// A non-loopback --grpc-listen needs a token, or a client CA (mutual TLS
// authenticates every caller).
func TestGRPCTLSStandsForAToken(t *testing.T) {
	ca, cert, key, _, _ := tlsFiles(t)
	var o rlsOptions
	fs := flag.NewFlagSet("limitd", flag.ContinueOnError)
	o.register(fs)
	if err := fs.Parse([]string{"--grpc-listen", "0.0.0.0:8081", "--rls-config", "x.yaml", "--grpc-tls-cert", cert, "--grpc-tls-key", key}); err != nil {
		t.Fatal(err)
	}
	if err := o.check(0); err == nil || !strings.Contains(err.Error(), "--grpc-tls-client-ca") {
		t.Errorf("TLS without a client CA, no token: %v, want an error naming --grpc-tls-client-ca", err)
	}
	o.tls.clientCA = ca.File
	if err := o.check(0); err != nil {
		t.Errorf("mutual TLS, no token: %v", err)
	}
}

// limitd with --grpc-tls-cert, --grpc-tls-key and --grpc-tls-client-ca on
// a real Redis: a client with a certificate of the CA is answered by the
// rate limit service and the quota service (a stream) on the one door, as
// the caller its certificate names; a cleartext client is not.
func TestRunGRPCMutualTLS(t *testing.T) {
	srv := redistest.Start(t)
	ca, cert, key, clientCert, clientKey := tlsFiles(t)
	addr, logs, cancel, done := start(t, []string{"--listen", "127.0.0.1:0", "--redis", srv.Addr(),
		"--grpc-listen", "127.0.0.1:0", "--rls-config", writeConfig(t, rlsYAML),
		"--grpc-tls-cert", cert, "--grpc-tls-key", key, "--grpc-tls-client-ca", ca.File, "--grpc-tls-client-san", "envoy.envoy-gateway-system"}, env())
	cfg, err := testpki.ClientConfig("127.0.0.1", clientCert, clientKey, ca.File)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(grpcAddr(t, logs), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	req := &pb.RateLimitRequest{Domain: "apis", Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "slow"}}}}}
	r, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req, grpc.WaitForReady(true))
	if err != nil || r.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit over mutual TLS: %v %v\n%s", r, err, logs)
	}
	q, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "apis", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqspb.BucketId{Bucket: map[string]string{"generic_key": "slow"}}, NumRequestsAllowed: 1,
	}}}); err != nil {
		t.Fatal(err)
	}
	qr, err := q.Recv()
	if err != nil || len(qr.BucketAction) != 1 || qr.BucketAction[0].GetQuotaAssignmentAction() == nil {
		t.Fatalf("the quota stream over mutual TLS: %v %v", qr, err)
	}
	_ = q.CloseSend()

	plain, err := grpc.NewClient(grpcAddr(t, logs), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	pctx, pstop := context.WithTimeout(ctx, 5*time.Second)
	defer pstop()
	if _, err := pb.NewRateLimitServiceClient(plain).ShouldRateLimit(pctx, req); err == nil {
		t.Error("a cleartext client was answered")
	}

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `limitd_rls_authorized_calls_total{caller="*.envoy-gateway-system"} 2`; !strings.Contains(string(m), want) {
		t.Errorf("/metrics lacks %s", want)
	}
	if !strings.Contains(string(m), "\nlimitd_grpc_tls_handshake_failures_total ") || strings.Contains(string(m), "\nlimitd_grpc_tls_handshake_failures_total 0\n") {
		t.Error("/metrics: the cleartext client's failed handshakes are not counted")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return")
	}
}
