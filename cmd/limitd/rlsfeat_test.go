package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// logAddr is the addr of the first log line whose msg is msg.
func logAddr(t *testing.T, logs *syncBuffer, msg string) string {
	t.Helper()
	for _, line := range strings.Split(logs.String(), "\n") {
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == msg {
			return rec.Addr
		}
	}
	t.Fatalf("no %q in the log:\n%s", msg, logs)
	return ""
}

// --prometheus-listen serves envoyproxy/ratelimit's series at
// --prometheus-path only; a port taken names the flag.
func TestRunPrometheusListen(t *testing.T) {
	_, logs, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--rls-config", writeConfig(t, rlsYAML),
		"--prometheus-listen", "127.0.0.1:0", "--prometheus-path", "/stats/prometheus"}, env())
	conn, err := grpc.NewClient(grpcAddr(t, logs), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	c := pb.NewRateLimitServiceClient(conn)
	req := &pb.RateLimitRequest{Domain: "apis", Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "slow"}}}}}
	for range 3 {
		if _, err := c.ShouldRateLimit(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	base := "http://" + logAddr(t, logs, "rate limit service's prometheus series listening")
	resp, err := http.Get(base + "/stats/prometheus")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{domain="apis",key1="generic_key_slow"} 3`,
		`ratelimit_service_rate_limit_over_limit{domain="apis",key1="generic_key_slow"} 1`,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 3`,
		`ratelimit_service_config_load_success 1`,
	} {
		if !strings.Contains(string(m), want) {
			t.Errorf("%s lacks %s:\n%s", base, want, m)
		}
	}
	if strings.Contains(string(m), "limitd_") || strings.Contains(string(m), "go_goroutines") {
		t.Errorf("limitd's own series on --prometheus-listen:\n%s", m)
	}
	if resp, err := http.Get(base + "/metrics"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("/metrics on --prometheus-listen: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	err = run(context.Background(), []string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--rls-config", writeConfig(t, rlsYAML),
		"--prometheus-listen", taken.Addr().String()}, env(), io.Discard, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "--prometheus-listen: ") || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("a taken --prometheus-listen: %v", err)
	}
}
