package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/service"
)

func env(kv ...string) func(string) string {
	return func(k string) string {
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] == k {
				return kv[i+1]
			}
		}
		return ""
	}
}

func TestIsLoopback(t *testing.T) {
	tests := []struct {
		listen string
		want   bool
	}{
		{"127.0.0.1:8081", true},
		{"127.0.0.2:8081", true},
		{"[::1]:8081", true},
		{"localhost:8081", true},
		{":8081", false},
		{"0.0.0.0:8081", false},
		{"[::]:8081", false},
		{"10.0.0.1:8081", false},
		{"example.com:8081", false},
	}
	for _, tt := range tests {
		got, err := isLoopback(tt.listen)
		if err != nil || got != tt.want {
			t.Errorf("isLoopback(%q) = %v, %v; want %v", tt.listen, got, err, tt.want)
		}
	}
	if _, err := isLoopback("nonsense"); err == nil {
		t.Error("isLoopback(nonsense): want an error")
	}
}

func TestLoadToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("  s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if toks, _, err := loadTokens(file, env("LIMITD_TOKEN", "other")); err != nil || len(toks) != 1 || toks[0].Value != "s3cret" {
		t.Errorf("from file: %+v, %v", toks, err)
	}
	if toks, _, err := loadTokens("", env("LIMITD_TOKEN", " fromenv ")); err != nil || len(toks) != 1 || toks[0].Value != "fromenv" {
		t.Errorf("from env: %+v, %v", toks, err)
	}
	if _, _, err := loadTokens(empty, env()); err == nil {
		t.Error("empty token file: want an error")
	}
	if _, _, err := loadTokens(filepath.Join(dir, "missing"), env()); err == nil {
		t.Error("missing token file: want an error")
	}
}

// TestLoadTokens: a token file may hold one token per gateway, "<name>
// <token>" per line (comments and blank lines skipped); a bare token is
// named "default".
func TestLoadTokens(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	if err := os.WriteFile(file, []byte("# gateways\ngw-a tok-a\n\ngw-b  tok-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	toks, _, err := loadTokens(file, env())
	if err != nil || len(toks) != 2 || toks[0] != (service.Token{Name: "gw-a", Value: "tok-a"}) || toks[1] != (service.Token{Name: "gw-b", Value: "tok-b"}) {
		t.Fatalf("loadTokens = %+v, %v", toks, err)
	}
	bare := filepath.Join(dir, "bare")
	if err := os.WriteFile(bare, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if toks, _, err := loadTokens(bare, env()); err != nil || len(toks) != 1 || toks[0] != (service.Token{Name: "default", Value: "s3cret"}) {
		t.Fatalf("bare token: %+v, %v", toks, err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("gw-a tok-a extra\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadTokens(bad, env()); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("three fields: %v, want an error naming line 1", err)
	}
	// LIMITD_TOKEN's caller is "default" too (docs/operating-limitd.md, "Who may call limitd").
	if toks, _, err := loadTokens("", env("LIMITD_TOKEN", "e")); err != nil || len(toks) != 1 || toks[0] != (service.Token{Name: "default", Value: "e"}) {
		t.Fatalf("from env: %+v, %v", toks, err)
	}
	if toks, _, err := loadTokens("", env()); err != nil || len(toks) != 0 {
		t.Fatalf("none: %+v, %v", toks, err)
	}
}

// TestLoadFrontProxy: a token file may name a front proxy's token and the
// callers known by the identity it forwards; a line that could be either is
// refused.
func TestLoadFrontProxy(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	body := "gw-a tok-a\nedge tok-edge front-proxy\ngw-c identity spiffe://cluster.local/ns/gw/sa/c\n"
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	toks, ids, err := loadTokens(file, env())
	if err != nil || len(toks) != 2 || toks[1] != (service.Token{Name: "edge", Value: "tok-edge", FrontProxy: true}) ||
		len(ids) != 1 || ids[0] != (service.Identity{Name: "gw-c", Value: "spiffe://cluster.local/ns/gw/sa/c"}) {
		t.Fatalf("loadTokens = %+v, %+v, %v", toks, ids, err)
	}
	for _, line := range []string{"x identity front-proxy", "x tok proxy", "x identity"} {
		bad := filepath.Join(dir, "bad")
		if err := os.WriteFile(bad, []byte("gw-a tok-a\n"+line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, ids, err := loadTokens(bad, env())
		if line == "x identity" { // a token that happens to read "identity"
			if err != nil || len(ids) != 0 {
				t.Errorf("%q: %+v, %v", line, ids, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: %v, want an error naming line 2", line, err)
		}
	}
	only := filepath.Join(dir, "only")
	if err := os.WriteFile(only, []byte("gw-c identity spiffe://x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadTokens(only, env()); err == nil {
		t.Error("identities without a token: want an error")
	}
}

// TestLoadTokensRefusesSharedValue: two lines that give the same token (or
// the same identity) to different callers would send every call to the
// last one; the file is refused, naming both lines.
func TestLoadTokensRefusesSharedValue(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ body, want string }{
		{"gw-a tok\ngw-b other\ngw-c tok\n", "lines 1 and 3"},
		{"# c\ntok\ngw-b tok\n", "lines 2 and 3"},
		{"gw-a tok\nedge tok front-proxy\n", "lines 1 and 2"},
		{"gw-a tok\ngw-a tok\n", "lines 1 and 2"},
		{"edge e front-proxy\nx identity v\ny identity v\n", "lines 2 and 3"},
	} {
		file := filepath.Join(dir, "tokens")
		if err := os.WriteFile(file, []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := loadTokens(file, env())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error naming %s", tc.body, err, tc.want)
		}
	}
}

func TestRedisOptions(t *testing.T) {
	tests := []struct {
		redis, master string
		cluster       bool
		wantAddrs     []string
		wantKind      string
		wantPass      string
		wantDB        int
	}{
		{"redis://:pw@127.0.0.1:6380/2", "", false, []string{"127.0.0.1:6380"}, "single", "pw", 2},
		{"127.0.0.1:6379", "", false, []string{"127.0.0.1:6379"}, "single", "envpw", 0},
		{"127.0.0.1:7000, 127.0.0.1:7001,127.0.0.1:7002", "", false, []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}, "cluster", "envpw", 0},
		{"127.0.0.1:7000", "", true, []string{"127.0.0.1:7000"}, "cluster", "envpw", 0},
		{"127.0.0.1:26379,127.0.0.1:26380", "mymaster", false, []string{"127.0.0.1:26379", "127.0.0.1:26380"}, "sentinel", "envpw", 0},
	}
	for _, tt := range tests {
		o := &options{redis: tt.redis, redisMaster: tt.master, redisCluster: tt.cluster, timeout: time.Second}
		u, err := redisOptions(o, env("LIMITD_REDIS_PASSWORD", "envpw"))
		if err != nil {
			t.Errorf("%q: %v", tt.redis, err)
			continue
		}
		kind := "single"
		switch {
		case u.MasterName != "":
			kind = "sentinel"
		case len(u.Addrs) > 1 || u.IsClusterMode:
			kind = "cluster"
		}
		if strings.Join(u.Addrs, ",") != strings.Join(tt.wantAddrs, ",") || kind != tt.wantKind ||
			u.Password != tt.wantPass || u.DB != tt.wantDB || u.MaxRetries != -1 {
			t.Errorf("%q: addrs %v kind %s password %q db %d retries %d; want %v %s %q %d -1",
				tt.redis, u.Addrs, kind, u.Password, u.DB, u.MaxRetries, tt.wantAddrs, tt.wantKind, tt.wantPass, tt.wantDB)
		}
	}
	for _, bad := range []string{"redis://[bad", "nohostport", " , "} {
		if _, err := redisOptions(&options{redis: bad}, env()); err == nil {
			t.Errorf("redisOptions(%q): want an error", bad)
		}
	}
}

func TestRunRefusesPublicWithoutToken(t *testing.T) {
	err := run(context.Background(), []string{"--listen", "0.0.0.0:0"}, env(), io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "bearer token is required") {
		t.Fatalf("run on 0.0.0.0 without a token = %v, want a refusal", err)
	}
}

func TestRunFlagErrors(t *testing.T) {
	for _, args := range [][]string{{"--nope"}, {"extra"}, {"--log-level", "loud"}, {"--listen", "nonsense"}, {"--key-prefix", "a{", "--redis", "127.0.0.1:1"}} {
		if err := run(context.Background(), args, env(), io.Discard, nil); err == nil {
			t.Errorf("run(%q): want an error", args)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the logger and the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs limitd with args until the returned cancel; it returns the
// address, the log and a channel with run's result.
func start(t *testing.T, args []string, getenv func(string) string) (string, *syncBuffer, context.CancelFunc, chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, getenv, logs, func(a string) { addr <- a }) }()
	select {
	case a := <-addr:
		t.Cleanup(cancel)
		return a, logs, cancel, done
	case err := <-done:
		cancel()
		t.Fatalf("run: %v\n%s", err, logs)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("run did not start:\n%s", logs)
	}
	return "", nil, nil, nil
}

// TestRunMemoryGracefulShutdown starts limitd without Redis (it must say
// so), then cancels it while a request is half sent: the request is still
// answered, and run returns nil.
func TestRunMemoryGracefulShutdown(t *testing.T) {
	addr, logs, cancel, done := start(t, []string{"--listen", "127.0.0.1:0"}, env())
	if !strings.Contains(logs.String(), "buckets are kept in memory") {
		t.Fatalf("no in-memory warning at start:\n%s", logs)
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"buckets":[{"key":"a","tokens_per_second":1,"burst":1}]}`
	// Expect: 100-continue makes the server say when the handler starts
	// reading the body: from then on the request is in flight.
	head := "POST /v1/decide HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n"
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "100 Continue") {
		t.Fatalf("no 100 Continue: %q, %v", line, err)
	}
	if _, err := br.ReadString('\n'); err != nil { // the blank line ending it
		t.Fatal(err)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "shutting down") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // bounded wait for the shutdown to begin
	}
	if _, err := io.WriteString(conn, body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("in-flight request not answered: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"allowed":true`) {
		t.Fatalf("in-flight request: %d %s", resp.StatusCode, b)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v after a graceful shutdown", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after shutdown")
	}
	if !strings.Contains(logs.String(), `"msg":"stopped"`) {
		t.Fatalf("no stop log:\n%s", logs)
	}
}

// TestRunRedisWithToken runs limitd on a real Redis, bound publicly with a
// token from the environment.
func TestRunRedisWithToken(t *testing.T) {
	srv := redistest.Start(t)
	addr, logs, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--redis", srv.Addr()}, env("LIMITD_TOKEN", "tok"))
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "redis store ready") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // bounded wait for the first script load
	}
	if !strings.Contains(logs.String(), "redis store ready") {
		t.Fatalf("no redis start log:\n%s", logs)
	}
	url := "http://" + addr + "/v1/decide"
	body := `{"buckets":[{"key":"a","tokens_per_second":1,"burst":1}]}`
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("without token: %d, want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"allowed":true`) {
		t.Fatalf("with token: %d %s", resp.StatusCode, b)
	}
	resp, err = http.Get("http://" + addr + "/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("readyz: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"limitd_decisions_total", "go_goroutines", "limitd_redis_batch_size"} {
		if !strings.Contains(string(m), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// TestMetricsAccess: /metrics shows request values in its labels, so on a
// listener that is not loopback it needs a caller's token, unless
// --metrics-listen serves it on a listener of its own.
func TestMetricsAccess(t *testing.T) {
	for _, tt := range []struct {
		listen, metricsListen string
		want                  service.MetricsAccess
	}{
		{"127.0.0.1:8081", "", service.MetricsOpen},
		{"[::1]:8081", "", service.MetricsOpen},
		{"0.0.0.0:8081", "", service.MetricsBearer},
		{":8081", "", service.MetricsBearer},
		{"10.0.0.1:8081", "", service.MetricsBearer},
		{"0.0.0.0:8081", "10.0.0.1:9090", service.MetricsElsewhere},
		{"127.0.0.1:8081", "127.0.0.1:9090", service.MetricsElsewhere},
	} {
		got, err := metricsAccess(tt.listen, tt.metricsListen)
		if err != nil || got != tt.want {
			t.Errorf("metricsAccess(%q, %q) = %v, %v; want %v", tt.listen, tt.metricsListen, got, err, tt.want)
		}
	}
	if _, err := metricsAccess("127.0.0.1:8081", "127.0.0.1:8081"); err == nil {
		t.Error("--metrics-listen equal to --listen: want an error")
	}
}

// TestRunMetricsListen: with --metrics-listen, /metrics is served there
// (no token: the operator chose who reaches it) and no longer on --listen.
func TestRunMetricsListen(t *testing.T) {
	addr, logs, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, env("LIMITD_TOKEN", "tok"))
	var maddr string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"msg":"metrics listening"`) {
			if i := strings.Index(line, `"addr":"`); i >= 0 {
				maddr = line[i+len(`"addr":"`):]
				maddr = maddr[:strings.IndexByte(maddr, '"')]
			}
		}
	}
	if maddr == "" {
		t.Fatalf("no metrics listening log with its address:\n%s", logs)
	}
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("http://" + maddr + "/metrics"); code != 200 || !strings.Contains(body, "limitd_decisions_total") {
		t.Fatalf("GET /metrics on --metrics-listen: %d, want 200 with the metrics", code)
	}
	if code, _ := get("http://" + maddr + "/v1/decide"); code != 404 {
		t.Fatalf("GET /v1/decide on --metrics-listen: %d, want 404 (only /metrics there)", code)
	}
	if code, _ := get("http://" + addr + "/metrics"); code != 404 {
		t.Fatalf("GET /metrics on --listen: %d, want 404 (served on --metrics-listen)", code)
	}
	if code, _ := get("http://" + addr + "/healthz"); code != 200 {
		t.Fatalf("GET /healthz on --listen: %d, want 200", code)
	}
}

func TestBackoffDelay(t *testing.T) {
	b := backoff{First: 100 * time.Millisecond, Max: time.Second}
	for _, tt := range []struct {
		n    int
		want time.Duration
	}{{1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {4, 800 * time.Millisecond}, {5, time.Second}, {60, time.Second}} {
		if got := b.delay(tt.n); got != tt.want {
			t.Errorf("delay(%d) = %v, want %v", tt.n, got, tt.want)
		}
	}
}

// TestWaitForRedis: failures are retried until load succeeds; a cancelled
// context ends the wait.
func TestWaitForRedis(t *testing.T) {
	b := backoff{First: time.Microsecond, Max: time.Microsecond, Attempt: time.Second}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	calls := 0
	load := func(context.Context) (string, error) {
		calls++
		if calls < 3 {
			return "", errors.New("connection refused")
		}
		return "sha", nil
	}
	sha, n, err := waitForRedis(context.Background(), load, b, log)
	if sha != "sha" || n != 3 || err != nil {
		t.Fatalf("waitForRedis = %q, %d, %v; want sha, 3, nil", sha, n, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	never := func(context.Context) (string, error) {
		cancel()
		return "", errors.New("connection refused")
	}
	if _, _, err := waitForRedis(ctx, never, b, log); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v, want context.Canceled", err)
	}
}

// getStatus returns the status and body of GET url.
func getStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRunWaitsForRedis starts limitd while its Redis is down: it serves, says
// it is waiting, answers /readyz 503 and /healthz 200; once Redis is back,
// /readyz turns 200 without a restart.
func TestRunWaitsForRedis(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	addr, logs, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--redis", srv.Addr()}, env())
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), `"attempt":2`) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // bounded wait for two failed attempts
	}
	if !strings.Contains(logs.String(), "waiting for redis") {
		t.Fatalf("no waiting log:\n%s", logs)
	}
	if code, body := getStatus(t, "http://"+addr+"/readyz"); code != 503 || !strings.Contains(body, "waiting for redis") {
		t.Fatalf("readyz while Redis is down: %d %s, want 503 waiting for redis", code, body)
	}
	if code, _ := getStatus(t, "http://"+addr+"/healthz"); code != 200 {
		t.Fatalf("healthz while Redis is down: %d, want 200", code)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(15 * time.Second)
	for {
		code, body := getStatus(t, "http://"+addr+"/readyz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz %d %s 15 s after Redis came back:\n%s", code, body, logs)
		}
		time.Sleep(20 * time.Millisecond) // polling readiness with a deadline
	}
	if !strings.Contains(logs.String(), "redis store ready") {
		t.Fatalf("no ready log:\n%s", logs)
	}
}

// TestRunIdleHealthzFlood: connections that each asked /healthz once and
// then stay open (the keep-alive flood that exhausted file descriptors)
// cannot keep an authenticated gateway out: at the cap, the anonymous ones
// are evicted for it, and it is answered.
func TestRunIdleHealthzFlood(t *testing.T) {
	testIdleHealthzFlood(t, "16")
}

// testIdleHealthzFlood runs the flood against limitd with --max-conns max,
// in a process whose open-file limit is lowered to 256: 150 anonymous
// connections (both their ends are in this process) exceed it unless
// limitd caps its side.
func testIdleHealthzFlood(t *testing.T, max string) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur > 256 {
		low := lim
		low.Cur = 256
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) })
	}
	addr, _, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--max-conns", max}, env("LIMITD_TOKEN", "tok"))
	for i := range 150 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Logf("dial %d: %v", i, err) // out of file descriptors: the flood has done its harm
			break
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			continue // evicted already
		}
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			resp.Body.Close()
		}
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/decide", strings.NewReader(`{"buckets":[{"key":"a","tokens_per_second":1,"burst":1}]}`))
	req.Header.Set("Authorization", "Bearer tok")
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("an authenticated call after 150 idle anonymous connections: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("authenticated call: %d, want 200", resp.StatusCode)
	}
}

// TestRunServesH2C: limitd serves HTTP/2 over cleartext (prior knowledge,
// as an Envoy cluster with http2_protocol_options speaks it) and HTTP/1.1
// on the same port; many concurrent h2c calls share one connection.
//
// The calls go over one http.ClientConn, one TCP connection by
// construction: a Transport's pool may dial again when a call races the
// pool's return of the first connection (seen under load), which says
// nothing of limitd. A connection limitd closed or refused fails the calls.
func TestRunServesH2C(t *testing.T) {
	addr, _, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--max-conns", "4"}, env("LIMITD_TOKEN", "tok"))
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	cc, err := (&http.Transport{Protocols: &h2c}).NewClientConn(t.Context(), "http", addr)
	if err != nil {
		t.Fatalf("h2c connection: %v", err)
	}
	t.Cleanup(func() { cc.Close() })
	call := func(rt http.RoundTripper, key string) (*http.Response, error) {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/decide", strings.NewReader(`{"buckets":[{"key":"`+key+`","tokens_per_second":1,"burst":1}]}`))
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: rt}).Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				err = errors.New(resp.Proto + " " + resp.Status)
			}
		}
		return resp, err
	}
	resp, err := call(cc, "first")
	if err != nil || resp.ProtoMajor != 2 {
		t.Fatalf("h2c call: %v over %v, want 200 over HTTP/2", err, resp)
	}
	// 40 concurrent calls, ten times the connection cap, on that connection.
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Go(func() {
			if _, err := call(cc, "k"+strconv.Itoa(i)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent h2c call: %v", err)
	}
	if err := cc.Err(); err != nil {
		t.Errorf("the h2c connection after 41 calls: %v", err)
	}
	resp, err = call(&http.Transport{}, "h1")
	if err != nil || resp.ProtoMajor != 1 {
		t.Fatalf("HTTP/1.1 call on the same port: %v %v", resp, err)
	}
}

// TestVersion: --version prints the version and starts nothing; a build
// stamped with the linker, as `make release` stamps it, prints that
// version.
func TestVersion(t *testing.T) {
	var out bytes.Buffer
	versionOut = &out
	t.Cleanup(func() { versionOut = os.Stdout })
	var stderr bytes.Buffer
	if err := run(t.Context(), []string{"--version", "--listen", "0.0.0.0:1"}, env(), &stderr, nil); err != nil {
		t.Fatalf("--version: %v (%s)", err, stderr.String())
	}
	if out.String() != "limitd dev\n" {
		t.Errorf("--version printed %q, want %q", out.String(), "limitd dev\n")
	}

	bin := filepath.Join(t.TempDir(), "limitd")
	build := exec.Command("go", "build", "-ldflags=-X github.com/ratelimit-wasm/tokenbucket/internal/version.Version=v9.8.7-rc1", "-o", bin, ".")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	b, err := exec.Command(bin, "--version").Output()
	if err != nil || string(b) != "limitd v9.8.7-rc1\n" {
		t.Errorf("the stamped build's --version: %q, %v; want %q", b, err, "limitd v9.8.7-rc1\n")
	}
}

// stopRun cancels a run started in the background and waits (15 s at most)
// for it to return nil on done.
func stopRun(t *testing.T, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
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
