package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
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

// --prometheus-listen serves envoyproxy/ratelimit's series, and the Go
// runtime's and the process's as its default registry does, at
// --prometheus-path only; a port taken names the flag.
func TestRunPrometheusListen(t *testing.T) {
	_, logs, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--rls-config", writeConfig(t, rlsYAML),
		"--prometheus-listen", "127.0.0.1:0", "--prometheus-path", "/stats/prometheus"}, env())
	conn := dialGRPC(t, grpcAddr(t, logs))
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
		`process_resident_memory_bytes `, // Envoy Gateway's dashboard reads it there
	} {
		if !strings.Contains(string(m), want) {
			t.Errorf("%s lacks %s:\n%s", base, want, m)
		}
	}
	if strings.Contains(string(m), "limitd_") {
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

// configDir is a new folder of files (name → content).
func configDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// --check reads a configuration folder as the service would and exits:
// each refused file's error with its file, line and field path, or a
// one-line summary; non-zero exit status (an error from run) on an error.
// Nothing is started (no listener, no Redis).
func TestRunCheck(t *testing.T) {
	var out strings.Builder
	checkOut = &out
	t.Cleanup(func() { checkOut = os.Stdout })
	check := func(args ...string) (string, error) {
		out.Reset()
		err := run(context.Background(), append([]string{"--listen", "256.0.0.1:1", "--redis", "127.0.0.1:1"}, args...), env(), io.Discard, nil)
		return out.String(), err
	}

	good := configDir(t, map[string]string{
		"apis.yaml":  rlsYAML,
		"other.yaml": "domain: other\ndescriptors:\n  - key: k\n    descriptors:\n      - key: free\n        rate_limit: {unlimited: true}\n",
		"notes.txt":  "not a configuration file",
	})
	got, err := check("--rls-config", good, "--check")
	if err != nil || got != good+": ok: 2 files, 2 domains, 3 descriptors (2 with a limit)\n" {
		t.Errorf("a good folder: %v, %q", err, got)
	}

	bad := configDir(t, map[string]string{
		"a.yaml": rlsYAML,
		"b.yaml": "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
		"c.yaml": "domain: c\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n",
		"d.yaml": "domain: apis\ndescriptors: []\n",
		"e.yaml": "domain: e\ndescriptors: [\n",
		"f.yaml": "domain: f\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"g.yaml": "domain: g\ndescriptors:\n  - key: k\n    rate_limt: {unit: second, requests_per_unit: 1}\n",
	})
	got, err = check("--rls-config", bad, "--check")
	if err == nil || err.Error() != "--check: "+bad+": 5 of 7 files refused" {
		t.Errorf("a bad folder: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	wants := []string{
		"rlsconfig: " + filepath.Join(bad, "b.yaml") + ":4: descriptors[0].rate_limit.unit: ",
		"rlsconfig: " + filepath.Join(bad, "c.yaml") + ":6: descriptors[0].rate_limit.requests_per_unit: ",
		"rlsconfig: " + filepath.Join(bad, "d.yaml") + ":1: domain: duplicate domain \"apis\"",
		"rlsconfig: " + filepath.Join(bad, "e.yaml") + ":",
		"rlsconfig: " + filepath.Join(bad, "g.yaml") + ":4: descriptors[0]",
	}
	if len(lines) != len(wants) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(wants), got)
	}
	for i, want := range wants {
		if !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d: %q, want it to start with %q", i+1, lines[i], want)
		}
	}

	one := configDir(t, map[string]string{"apis.yaml": rlsYAML})
	if got, err := check("--rls-config", one, "--check"); err != nil || got != one+": ok: 1 file, 1 domain, 1 descriptor (1 with a limit)\n" {
		t.Errorf("a folder of one file: %v, %q", err, got)
	}

	if _, err := check("--check"); err == nil || err.Error() != "--check: needs --rls-config" {
		t.Errorf("--check alone: %v", err)
	}
	if _, err := check("--rls-config", filepath.Join(good, "missing"), "--check"); err == nil {
		t.Error("a missing path passed the check")
	}
}

// An attacker holding --prometheus-listen's connections (100 that send a
// request's first bytes and never finish it, from this separate client)
// does not keep the scraper out: the listener keeps at most 16 open,
// evicting the unfinished ones once past their grace, and a scrape is
// answered within a bounded wait.
func TestRunPrometheusListenFlood(t *testing.T) {
	_, logs, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--rls-config", writeConfig(t, rlsYAML),
		"--prometheus-listen", "127.0.0.1:0"}, env())
	addr := logAddr(t, logs, "rate limit service's prometheus series listening")
	var flood []net.Conn
	for range 100 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break // refused at the cap: the flood is bounded
		}
		flood = append(flood, c)
		t.Cleanup(func() { c.Close() })
		_, _ = io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	}
	client := &http.Client{Timeout: 2 * time.Second}
	var last error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := client.Get("http://" + addr + "/metrics")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			err = errors.New(resp.Status)
		}
		last = err
		if time.Now().After(deadline) {
			t.Fatalf("no scrape answered within 20 s of the flood: %v", last)
		}
	}
	open := 0
	for _, c := range flood {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
			open++
		}
	}
	if open > maxMetricsConns {
		t.Errorf("%d of the flood's connections still open, want at most %d", open, maxMetricsConns)
	}
	t.Logf("%d connections dialled, %d still open after the scrape", len(flood), open)
}
