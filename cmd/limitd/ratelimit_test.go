package main

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// configMap lays out yaml as Kubernetes mounts a ConfigMap's key
// config.yaml at root/ratelimit/config: the file a link into ..data, a
// link to a timestamped folder. It returns root.
func configMap(t *testing.T, yaml string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	stamp := filepath.Join(dir, "..2026_11_29_10_00_00.000000001")
	if err := os.MkdirAll(stamp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stamp, "config.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(stamp), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/config.yaml", filepath.Join(dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	return root
}

// loopbackEnv is Istio's sample's environment with its listeners moved to
// loopback ports of the system's choosing.
func loopbackEnv(redisAddr, root string, kv ...string) func(string) string {
	base := []string{"LOG_LEVEL", "debug", "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", redisAddr, "USE_STATSD", "false",
		"RUNTIME_ROOT", root, "RUNTIME_SUBDIRECTORY", "ratelimit", "RUNTIME_IGNOREDOTFILES", "true", "RUNTIME_WATCH_ROOT", "false",
		"HOST", "127.0.0.1", "PORT", "0", "GRPC_HOST", "127.0.0.1", "GRPC_PORT", "0", "DEBUG_HOST", "127.0.0.1", "DEBUG_PORT", "0"}
	return envOver(base, kv...)
}

// startMode runs the ratelimit mode until the test ends; it returns the
// listeners' addresses and the log.
func startMode(t *testing.T, getenv func(string) string) (*modeAddrs, *syncBuffer, chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	started := make(chan struct{}, 1)
	done := make(chan error, 1)
	var mode *ratelimitMode
	go func() {
		done <- runMode(ctx, getenv, logs, func(string) { started <- struct{}{} }, func(m *ratelimitMode) { mode = m })
	}()
	select {
	case <-started:
		t.Cleanup(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Error("run did not return")
			}
		})
		return mode.addrs.Load(), logs, done
	case err := <-done:
		cancel()
		t.Fatalf("run: %v\n%s", err, logs)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("run did not start:\n%s", logs)
	}
	return nil, nil, nil
}

// TestRatelimitModeIstio: Istio's sample's environment and ConfigMap
// layout, ports moved: /healthcheck answers 200 "OK" once Redis answered
// (500 with no body before, as the peer's health checker fails), /json
// and gRPC answer without a token (with a warning in the log), and the
// debug listener says what it does not serve.
func TestRatelimitModeIstio(t *testing.T) {
	// Redis not there yet: /healthcheck fails.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	root := configMap(t, rlsYAML)
	addrs, _, _ := startMode(t, loopbackEnv(deadAddr, root))
	if code, body := getStatus(t, "http://"+addrs.HTTP+"/healthcheck"); code != 500 || body != "" {
		t.Errorf("/healthcheck without Redis: %d %q, want 500 and no body", code, body)
	}

	srv := redistest.Start(t)
	addrs, logs, _ := startMode(t, loopbackEnv(srv.Addr(), root))
	if !strings.Contains(logs.String(), "serves every caller, unauthenticated") {
		t.Errorf("no warning of the open gRPC listener in the log:\n%s", logs)
	}
	if addrs.API != "" {
		t.Errorf("limitd's HTTP API on %s without LIMITD_LISTEN", addrs.API)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := getStatus(t, "http://"+addrs.HTTP+"/healthcheck")
		if code == 200 && body == "OK" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthcheck: %d %q, never 200 OK\n%s", code, body, logs)
		}
		time.Sleep(20 * time.Millisecond) // bounded by the deadline: Redis's first answer
	}

	// /json: the peer's JSON in and out, 429 when over the limit.
	var codes []int
	var last map[string]any
	for range 3 {
		resp, err := http.Post("http://"+addrs.HTTP+"/json", "application/json",
			strings.NewReader(`{"domain":"apis","descriptors":[{"entries":[{"key":"generic_key","value":"slow"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		last = nil
		if err := json.Unmarshal(b, &last); err != nil {
			t.Fatalf("/json: %q: %v", b, err)
		}
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 || last["overallCode"] != "OVER_LIMIT" {
		t.Errorf("/json: %v, last %v; want 200 200 429 and OVER_LIMIT", codes, last)
	}
	resp, err := http.Post("http://"+addrs.HTTP+"/json", "application/json", strings.NewReader(`{"domain":`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || strings.TrimSpace(string(b)) != "Bad Request" {
		t.Errorf("/json of bad JSON: %d %q, want 400 Bad Request", resp.StatusCode, b)
	}

	// gRPC, no token: the same limit, now over.
	conn := dialGRPC(t, addrs.GRPC)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "apis",
		Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "slow"}}}}})
	if err != nil || r.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("gRPC without a token: %v %v, want OVER_LIMIT", r, err)
	}

	if code, _ := getStatus(t, "http://"+addrs.Debug+"/"); code != 200 {
		t.Errorf("debug /: %d", code)
	}
	if code, body := getStatus(t, "http://"+addrs.Debug+"/rlconfig"); code != 200 ||
		body != "apis.generic_key_slow: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n" {
		t.Errorf("debug /rlconfig: %d %q", code, body)
	}
	if code, body := getStatus(t, "http://"+addrs.Debug+"/debug/pprof/"); code != 404 || !strings.Contains(body, "no pprof") {
		t.Errorf("debug /debug/pprof/: %d %q, want 404 saying why", code, body)
	}
}

// TestRatelimitModeToken: with LIMITD_TOKEN, gRPC calls need it and /json
// is refused.
func TestRatelimitModeToken(t *testing.T) {
	root := configMap(t, rlsYAML)
	addrs, logs, _ := startMode(t, loopbackEnv("127.0.0.1:1", root, "LIMITD_TOKEN", "s3cret"))
	if strings.Contains(logs.String(), "unauthenticated") {
		t.Errorf("warned of an open listener with a token:\n%s", logs)
	}
	resp, err := http.Post("http://"+addrs.HTTP+"/json", "application/json", strings.NewReader(`{"domain":"apis"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("/json with a token set: %d, want 403", resp.StatusCode)
	}
}

// TestRatelimitModeOpenDoor: without a token the gRPC listener may bind a
// non-loopback address (limitd refuses it), with one it must.
func TestRatelimitModeOpenDoor(t *testing.T) {
	var o rlsOptions
	o.register(flag.NewFlagSet("limitd", flag.ContinueOnError)) // the defaults
	o.grpcListen, o.config = "0.0.0.0:8081", "x"
	if err := o.check(0, false); err == nil {
		t.Error("limitd: a public gRPC listener without a token accepted")
	}
	if err := o.check(0, true); err != nil {
		t.Errorf("ratelimit mode: %v", err)
	}
}

// TestRatelimitPortClashNamesTheVariable: a listener that cannot bind names
// the variables of its address.
func TestRatelimitPortClashNamesTheVariable(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := strconv.Itoa(taken.Addr().(*net.TCPAddr).Port)
	root := configMap(t, rlsYAML)
	for _, v := range []string{"PORT", "GRPC_PORT", "DEBUG_PORT"} {
		ctx, cancel := context.WithCancel(context.Background())
		err := runMode(ctx, loopbackEnv("127.0.0.1:1", root, v, port), io.Discard, func(string) { cancel() }, nil)
		cancel()
		if err == nil || !strings.Contains(err.Error(), v) || !strings.Contains(err.Error(), "address already in use") {
			t.Errorf("%s on a port in use: %v, want an error naming %s", v, err, v)
		}
	}
}

// TestRatelimitRefusesArgs: the name "ratelimit" takes no flags.
func TestRatelimitRefusesArgs(t *testing.T) {
	err := runRatelimit(context.Background(), []string{"--listen", "127.0.0.1:0"}, env(), io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "environment variables only") {
		t.Errorf("runRatelimit with flags: %v", err)
	}
	if !isRatelimitName("/bin/ratelimit") || !isRatelimitName("build/ratelimit") || isRatelimitName("/bin/limitd") {
		t.Error("isRatelimitName")
	}
}

// TestRatelimitDotFiles: with RUNTIME_IGNOREDOTFILES=false (the peer's
// default), a dot file the peer would read refuses the start; Kubernetes'
// own dot entries do not.
func TestRatelimitDotFiles(t *testing.T) {
	root := configMap(t, rlsYAML)
	dir := filepath.Join(root, "ratelimit", "config")
	if err := checkDotFiles(dir); err != nil {
		t.Errorf("a ConfigMap's layout: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".extra.yaml"), []byte(rlsYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	err := runMode(context.Background(), loopbackEnv("127.0.0.1:1", root, "RUNTIME_IGNOREDOTFILES", "false"), io.Discard, nil, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "RUNTIME_IGNOREDOTFILES") {
		t.Errorf("a dot file: %v, want RUNTIME_IGNOREDOTFILES named", err)
	}
}

// TestRatelimitHTTPAttacker: a raw client holds more connections than the
// HTTP listener (HOST:PORT) keeps (maxModeConns), every one with a request
// never finished, and sends /json bodies past its bound and hostile JSON;
// meanwhile /healthcheck still answers, and the hostile bodies get 400.
func TestRatelimitHTTPAttacker(t *testing.T) {
	srv := redistest.Start(t)
	addrs, _, _ := startMode(t, loopbackEnv(srv.Addr(), configMap(t, rlsYAML)))
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range maxModeConns + 64 {
		c, err := net.DialTimeout("tcp", addrs.HTTP, 5*time.Second)
		if err != nil {
			continue // refused at the cap: what the guard may do
		}
		conns = append(conns, c)
		_, _ = c.Write([]byte("GET /healthcheck HTTP/1.1\r\nHost: x\r\nX-Slow: ")) // never finished
	}
	client := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := client.Get("http://" + addrs.HTTP + "/healthcheck")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && string(b) == "OK" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthcheck under %d unfinished requests: %v", len(conns), err)
		}
		time.Sleep(50 * time.Millisecond) // bounded by the deadline: Redis's first answer
	}
	for _, body := range []string{
		`{"domain":"apis","descriptors":[{"entries":[{"key":"generic_key","value":"` + strings.Repeat("x", maxJSONBytes) + `"}]}]}`,
		`{"domain":"apis","descriptors":[{"entries":[{"key":"generic_key","value":"\udc00"}]}]}`,
		strings.Repeat("[", 10000),
		`{"domain":"","descriptors":[]}`,
		`{"domain":"apis","hitsAddend":4294967295,"descriptors":[{"entries":[{"key":"generic_key","value":"slow"}]}]}`,
	} {
		resp, err := client.Post("http://"+addrs.HTTP+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("/json %.40q: %v", body, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 && resp.StatusCode != 429 {
			t.Errorf("/json %.40q: %d, want 400 (or 429 for hits past the limit)", body, resp.StatusCode)
		}
	}
}

// TestRatelimitOpenDoorEviction: with no token, every caller is equal, so
// none may keep a connection slot for good: an attacker that filled the
// gRPC listener's connections (LIMITD_GRPC_MAX_CONNS) with one call each
// cannot keep a new gateway out (before, each of its connections counted
// as authenticated, never evicted, and the gateway's was closed).
func TestRatelimitOpenDoorEviction(t *testing.T) {
	srv := redistest.Start(t)
	const maxConns = 8
	addrs, logs, _ := startMode(t, loopbackEnv(srv.Addr(), configMap(t, rlsYAML), "LIMITD_GRPC_MAX_CONNS", strconv.Itoa(maxConns)))
	req := &pb.RateLimitRequest{Domain: "apis", Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "other"}}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := func(conn *grpc.ClientConn) error {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		_, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, req)
		return err
	}
	var held []*grpc.ClientConn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < maxConns; i++ {
		c, err := grpc.NewClient(addrs.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		for call(c) != nil && ctx.Err() == nil { // the first calls wait for Redis
			time.Sleep(50 * time.Millisecond)
		}
	}
	gw, err := grpc.NewClient(addrs.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	if err := call(gw); err != nil {
		t.Fatalf("a gateway's call with %d connections held: %v\n%s", maxConns, err, logs)
	}
}

// TestRatelimitHealthNeedsADomain: with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED,
// /healthcheck fails while the configuration loaded has no domain, as the
// peer's does (an empty folder loads, and is not enough), and passes once
// a file gives one.
func TestRatelimitHealthNeedsADomain(t *testing.T) {
	srv := redistest.Start(t)
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	addrs, logs, _ := startMode(t, loopbackEnv(srv.Addr(), root, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true", "LIMITD_CONFIG_POLL", "50ms"))
	health := func() string {
		code, body := getStatus(t, "http://"+addrs.HTTP+"/healthcheck")
		return strconv.Itoa(code) + " " + body
	}
	// Redis answers within the bound; the empty configuration keeps it failing.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got := health(); got != "500 " {
			t.Fatalf("/healthcheck with no domain: %q, want 500\n%s", got, logs)
		}
		if strings.Contains(logs.String(), "redis store ready") {
			break
		}
	}
	if got := health(); got != "500 " {
		t.Fatalf("/healthcheck with no domain, Redis there: %q, want 500", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(rlsYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); health() != "200 OK"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("/healthcheck with a domain: %q, want 200 OK\n%s", health(), logs)
		}
	}
}
