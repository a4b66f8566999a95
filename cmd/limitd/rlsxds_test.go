package main

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRunRLSXDSFlagErrors(t *testing.T) {
	good := writeConfig(t, rlsYAML)
	x := []string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--rls-xds-server", "127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "127.0.0.1:0", "--rls-xds-server", "127.0.0.1:1"}, "--rls-xds-server: needs --grpc-listen"},
		{append(x, "--rls-config", good), "--grpc-listen: needs --rls-config or --rls-xds-server (one of them)"},
		{[]string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--rls-config", good, "--rls-xds-tls-ca", "ca.pem"}, "--rls-xds-tls-ca: needs --rls-xds-server"},
		{[]string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--rls-config", good, "--rls-start-without-config"}, "--rls-start-without-config: needs --rls-xds-server"},
		{append(x, "--rls-xds-node-metadata", "[1]"), `--rls-xds-node-metadata: want a JSON object, got "[1]"`},
		{append(x, "--rls-xds-headers", "a=1,b"), `--rls-xds-headers: want k=v,k=v, got "b"`},
		{append(x, "--rls-xds-tls-cert", good), "--rls-xds-tls-*: rlsxds: tls: a client certificate needs its key"},
		{append(x, "--rls-xds-tls-ca", "/nonexistent/ca.pem"), "/nonexistent/ca.pem"},
		{append(x, "--rls-xds-backoff", "0s"), "--rls-xds-backoff: must be > 0"},
		{append(x, "--rls-xds-backoff", "10s", "--rls-xds-backoff-max", "5s"), "--rls-xds-backoff-max: must be >= --rls-xds-backoff (10s), got 5s"},
		{append(x, "--rls-xds-max-recv-bytes", "-1"), "--rls-xds-max-recv-bytes: must be > 0"},
		{[]string{"--listen", "127.0.0.1:0", "--rls-xds-backoff", "2s"}, "--rls-xds-backoff: needs --rls-xds-server"},
	} {
		err := run(context.Background(), tc.args, env(), io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// adsFixture is go-control-plane's snapshot cache and ADS server, plaintext
// on loopback.
func adsFixture(t *testing.T) (string, func(version string, rs ...*rlsconf.RateLimitConfig)) {
	t.Helper()
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(context.Background(), cache, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String(), func(version string, rs ...*rlsconf.RateLimitConfig) {
		res := make([]types.Resource, len(rs))
		for i, r := range rs {
			res[i] = r
		}
		snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
		if err != nil {
			t.Fatal(err)
		}
		if err := cache.SetSnapshot(context.Background(), "envoy-ratelimit", snap); err != nil {
			t.Fatal(err)
		}
	}
}

var xdsConfig = &rlsconf.RateLimitConfig{Name: "default/policy", Domain: "apis", Descriptors: []*rlsconf.RateLimitDescriptor{
	{Key: "generic_key", Value: "slow", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 2}},
}}

// rlsCall makes one rate limit call on a connection of its own, closed on
// return, not with the test: TestRunRLSXDSStartWithoutConfig polls with
// up to 3,000 of them.
func rlsCall(t *testing.T, addr string) (*pb.RateLimitResponse, error) {
	t.Helper()
	conn := newGRPC(t, addr)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "apis",
		Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "slow"}}}}})
}

// Without --rls-start-without-config limitd opens no port before its
// first configuration over xDS (as envoyproxy/ratelimit without
// FORCE_START_WITHOUT_INITIAL_CONFIG), then serves it.
func TestRunRLSXDSWaitsForConfig(t *testing.T) {
	ads, set := adsFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &syncBuffer{}
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--rls-xds-server", ads,
			"--rls-xds-node-id", "envoy-ratelimit", "--rls-xds-node-metadata", `{"cluster":"rl"}`, "--rls-xds-headers", "x-a=1"},
			env(), logs, func(a string) { ready <- a })
	}()
	for i := 0; !strings.Contains(logs.String(), "waiting for the first configuration over xds"); i++ {
		if i > 2000 {
			t.Fatalf("no wait logged:\n%s", logs)
		}
		time.Sleep(5 * time.Millisecond) // bounded: polls the log
	}
	select {
	case a := <-ready:
		t.Fatalf("ready at %s before any configuration", a)
	default:
	}
	set("1", xdsConfig)
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("not ready 30s after the snapshot:\n%s", logs)
	}
	r, err := rlsCall(t, grpcAddr(t, logs))
	if err != nil || r.GetOverallCode() != pb.RateLimitResponse_OK || r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 2 {
		t.Fatalf("%v, %v", r, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// With --rls-start-without-config limitd serves at once, Unavailable until
// the first configuration, then by it; stopped before any, run ends.
func TestRunRLSXDSStartWithoutConfig(t *testing.T) {
	ads, set := adsFixture(t)
	_, logs, cancel, done := start(t, []string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--rls-xds-server", ads,
		"--rls-xds-node-id", "envoy-ratelimit", "--rls-start-without-config"}, env())
	addr := grpcAddr(t, logs)
	if _, err := rlsCall(t, addr); status.Code(err) != codes.Unavailable {
		t.Fatalf("before any configuration: %v, want Unavailable", err)
	}
	set("1", xdsConfig)
	for i := 0; ; i++ {
		r, err := rlsCall(t, addr)
		if err == nil && r.GetOverallCode() == pb.RateLimitResponse_OK {
			break
		}
		if i > 3000 {
			t.Fatalf("not configured: %v, %v\n%s", r, err, logs)
		}
		time.Sleep(5 * time.Millisecond) // bounded: until the snapshot arrives
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
