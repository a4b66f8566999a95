package main

import (
	"context"
	"encoding/json"
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
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

const rlsYAML = `domain: apis
descriptors:
  - key: generic_key
    value: slow
    rate_limit:
      unit: minute
      requests_per_unit: 2
`

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunRLSFlagErrors(t *testing.T) {
	good := writeConfig(t, rlsYAML)
	bad := writeConfig(t, "domain: apis\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--grpc-listen", "127.0.0.1:0"}, "--grpc-listen: needs --rls-config"},
		{[]string{"--rls-config", good}, "--rls-config: needs --grpc-listen"},
		{[]string{"--grpc-listen", "127.0.0.1:0", "--rls-config", good, "--rls-algorithm", "leaky"}, "--rls-algorithm: want token_bucket or fixed_window"},
		{[]string{"--grpc-listen", "0.0.0.0:0", "--rls-config", good}, "bearer token is required"},
		{[]string{"--grpc-listen", "nonsense", "--rls-config", good}, "--grpc-listen"},
		{[]string{"--grpc-listen", "127.0.0.1:0", "--rls-config", bad}, bad + ":4: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'"},
		{[]string{"--grpc-listen", "127.0.0.1:0", "--rls-config", good, "--rls-config-poll", "0s"}, "--rls-config-poll"},
		{[]string{"--grpc-listen", "127.0.0.1:0", "--rls-config", good, "--rls-near-limit-ratio", "1.5"}, "--rls-near-limit-ratio: want within (0, 1], got 1.5"},
		{[]string{"--grpc-listen", "127.0.0.1:0", "--rls-config", good, "--rls-near-limit-ratio", "0"}, "--rls-near-limit-ratio"},
		{[]string{"--prometheus-listen", "127.0.0.1:0"}, "--prometheus-listen: needs --grpc-listen"},
		{[]string{"--grpc-listen", "127.0.0.1:9", "--rls-config", good, "--prometheus-listen", "127.0.0.1:9"}, "--prometheus-listen 127.0.0.1:9: the address of --grpc-listen"},
		{[]string{"--grpc-listen", "127.0.0.1:0", "--rls-config", good, "--rls-response-header-names", "a,b"}, "--rls-response-header-names: want three names"},
		{[]string{"--grpc-listen", "127.0.0.1:0", "--rls-config", good, "--rls-response-header-names", "a,b c,d"}, `--rls-response-header-names: "b c" is not a header name`},
		{[]string{"--grpc-listen", "127.0.0.1:0", "--rls-config", good, "--prometheus-listen", "127.0.0.1:0", "--prometheus-path", "metrics"}, "--prometheus-path: must start with /"},
	} {
		err := run(context.Background(), append([]string{"--listen", "127.0.0.1:0"}, tc.args...), env(), io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// grpcAddr is the address limitd logged for its rate limit service.
func grpcAddr(t *testing.T, logs *syncBuffer) string {
	t.Helper()
	for _, line := range strings.Split(logs.String(), "\n") {
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "rate limit service listening" {
			return rec.Addr
		}
	}
	t.Fatalf("no rate limit service address in the log:\n%s", logs)
	return ""
}

// dialGRPC is a plaintext client of the gRPC door at addr, closed with the
// test.
func dialGRPC(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn := newGRPC(t, addr)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// newGRPC is a plaintext client of the gRPC door at addr that its caller
// closes.
func newGRPC(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// limitd on a real Redis, bound to loopback with a token file: the rate
// limit service needs a token, reports its health, decides on Redis, and
// counts on /metrics; a graceful shutdown ends run with nil.
func TestRunRLSRedis(t *testing.T) {
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
	h := healthpb.NewHealthClient(conn)
	for {
		r, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		if err == nil && r.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("never SERVING: %v %v\n%s", r, err, logs)
		}
		time.Sleep(10 * time.Millisecond) // bounded by ctx: the store's first ping
	}
	c := pb.NewRateLimitServiceClient(conn)
	req := &pb.RateLimitRequest{Domain: "apis", Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "slow"}}}}}
	// On a connection of its own: the door closes a connection refused
	// for its credentials within a second, calls in flight and all.
	anon := pb.NewRateLimitServiceClient(dialGRPC(t, grpcAddr(t, logs)))
	if _, err := anon.ShouldRateLimit(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without a token: %v", err)
	}
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok1")
	var got []pb.RateLimitResponse_Code
	for range 3 {
		r, err := c.ShouldRateLimit(actx, req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.OverallCode)
	}
	if got[0] != pb.RateLimitResponse_OK || got[1] != pb.RateLimitResponse_OK || got[2] != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("codes %v, want OK OK OVER_LIMIT", got)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`limitd_rls_total_hits_total{descriptor="generic_key_slow",domain="apis"} 3`,
		`limitd_rls_over_limit_total{descriptor="generic_key_slow",domain="apis"} 1`,
		`limitd_rls_authorized_calls_total{caller="gw-1"} 3`,
		`limitd_rls_config_loads_total{result="success"} 1`,
	} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	stopRun(t, cancel, done)
}
