// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoyratelimit"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/loopback"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

const (
	// startTimeout bounds a service's start; waitTimeout a reload or a
	// log line. Both are generous: the machine may be loaded.
	startTimeout = 60 * time.Second
	waitTimeout  = 30 * time.Second
	// callTimeout bounds one direct gRPC call.
	callTimeout = 10 * time.Second
)

// kind is which rate limit service runs.
type kind string

const (
	limitd    kind = "limitd"
	reference kind = "envoyproxy-ratelimit"
)

// service is one rate limit service under test with its own redis-server.
type service struct {
	kind  kind
	redis *redistest.Server
	// grpcPort serves envoy.service.ratelimit.v3.RateLimitService.
	grpcPort int
	// configDir holds the YAML files the service reads and watches.
	configDir string
	log       func() string

	rl *envoyratelimit.Server // reference

	httpPort int // limitd's HTTP listener (/healthz, /metrics)
	conn     *grpc.ClientConn
}

// limitdBinary is $LIMITD_BIN (the Makefile exports build/limitd), else
// build/limitd of the checkout two directories up.
func limitdBinary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("LIMITD_BIN")
	if p == "" {
		p, _ = filepath.Abs(filepath.Join("..", "..", "build", "limitd"))
	}
	if st, err := os.Stat(p); err != nil || st.IsDir() {
		ci.Skip(t, "ratelimit: LIMITD_BIN=%q names no program (run `make build-service`)", p)
	}
	out, _ := exec.Command(p, "--help").CombinedOutput()
	if !bytes.Contains(out, []byte("grpc-listen")) {
		ci.Skip(t, "ratelimit: %s has no --grpc-listen (the rate limit service API): rebuild it (`make build-service`)", p)
	}
	return p
}

// startService starts a service of kind k on a new redis-server, with files
// (name → YAML) in its configuration folder; args are limitd's extra flags
// (e.g. "--rls-algorithm", "fixed_window") or, for the reference, extra
// environment ("NEAR_LIMIT_RATIO=0.5").
func startService(t *testing.T, k kind, files map[string]string, args ...string) *service {
	t.Helper()
	envoytest.Needs(t, false)
	r := redistest.Start(t)
	s := &service{kind: k, redis: r}
	switch k {
	case reference:
		s.rl = envoyratelimit.Start(t, envoyratelimit.Options{RedisAddr: r.Addr(), Configs: files, Env: args,
			StartTimeout: startTimeout})
		s.grpcPort, s.configDir, s.log = s.rl.GRPCPort(), s.rl.ConfigDir(), s.rl.Log
	case limitd:
		s.startLimitd(t, files, args)
	default:
		t.Fatalf("unknown service kind %q", k)
	}
	s.dial(t)
	return s
}

// newConn is a gRPC client of the service on port.
func newConn(port int) (*grpc.ClientConn, error) {
	return grpc.NewClient("127.0.0.1:"+strconv.Itoa(port), grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func (s *service) startLimitd(t *testing.T, files map[string]string, args []string) {
	t.Helper()
	s.configDir = filepath.Join(t.TempDir(), "rls")
	if err := os.Mkdir(s.configDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		s.writeFile(t, name, files[name])
	}
	if err := s.launchLimitd(t, s.configDir, args); err != nil {
		t.Fatal(err)
	}
}

// launchLimitd runs limitd on s.redis with --rls-config config (a file or
// a folder) and waits until it is ready. It returns an error, with limitd's
// log, when limitd exits first (a configuration it refuses at the start)
// or is not ready in time; else limitd is stopped when t ends.
func (s *service) launchLimitd(t *testing.T, config string, args []string) error {
	t.Helper()
	bin := limitdBinary(t)
	logPath := filepath.Join(t.TempDir(), "limitd.log")
	s.log = func() string { b, _ := os.ReadFile(logPath); return string(b) }
	for attempt := 1; ; attempt++ {
		s.httpPort, s.grpcPort = freePort(t), freePort(t)
		argv := append([]string{"--listen", "127.0.0.1:" + strconv.Itoa(s.httpPort),
			"--grpc-listen", "127.0.0.1:" + strconv.Itoa(s.grpcPort),
			"--rls-config", config, "--redis", s.redis.Addr()}, args...)
		logf, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, argv...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
		stop := func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
		err = waitLimitd(s.httpPort, s.grpcPort, done)
		if err == nil {
			t.Cleanup(func() {
				select {
				case <-done:
					t.Errorf("limitd exited during the test:\n%s", logtext.Tail(s.log(), 30))
				default:
					if t.Failed() {
						t.Logf("limitd's log tail:\n%s", logtext.Tail(s.log(), 30))
					}
				}
				stop()
			})
			return nil
		}
		stop()
		if attempt >= 3 || !strings.Contains(s.log(), "address already in use") {
			return fmt.Errorf("limitd did not start: %w\n%s", err, logtext.Tail(s.log(), 30))
		}
	}
}

// waitLimitd waits until limitd's /readyz answers 200 and its gRPC port
// accepts connections, or it exits.
func waitLimitd(httpPort, grpcPort int, done chan struct{}) error {
	hc := &http.Client{Timeout: 5 * time.Second}
	url := "http://127.0.0.1:" + strconv.Itoa(httpPort) + "/readyz"
	last := "no answer"
	for deadline := time.Now().Add(startTimeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case <-done:
			return fmt.Errorf("limitd exited")
		default:
		}
		resp, err := hc.Get(url)
		if err != nil {
			last = err.Error()
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = "/readyz " + resp.Status
			continue
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(grpcPort), time.Second)
		if err != nil {
			last = err.Error()
			continue
		}
		c.Close()
		return nil
	}
	return fmt.Errorf("not ready within %v: %s", startTimeout, last)
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := loopback.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// writeFile replaces the configuration file name atomically: written
// beside the folder, then renamed in.
func (s *service) writeFile(t *testing.T, name, yaml string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(s.configDir), "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.configDir, name)); err != nil {
		t.Fatal(err)
	}
}

// waitLog waits until the service's log has a line containing every one
// of substrs, and returns that line.
func (s *service) waitLog(t *testing.T, substrs ...string) string {
	t.Helper()
	for deadline := time.Now().Add(waitTimeout); ; time.Sleep(50 * time.Millisecond) {
		for _, l := range strings.Split(s.log(), "\n") {
			if containsAll(l, substrs) {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no log line with %q within %v:\n%s", s.kind, substrs, waitTimeout, logtext.Tail(s.log(), 30))
		}
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// metrics is limitd's /metrics text.
func (s *service) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(s.httpPort) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// entries is one descriptor: key, value, key, value...
type entries []string

func descriptor(kv entries) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// call asks the service directly, as Envoy would, about the descriptors
// with hits (0: the service's default of 1).
func (s *service) call(domain string, hits uint32, ds ...entries) (*rlsv3.RateLimitResponse, error) {
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for _, d := range ds {
		req.Descriptors = append(req.Descriptors, descriptor(d))
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return rlsv3.NewRateLimitServiceClient(s.conn).ShouldRateLimit(ctx, req)
}

// waitLimit waits until the service decides descriptor d of domain with a
// limit of requestsPerUnit: how a test knows a rewritten file was applied.
// Each probe takes one hit from d's bucket, so d should be a probe of its
// own.
func (s *service) waitLimit(t *testing.T, domain string, d entries, requestsPerUnit uint32) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(waitTimeout); ; time.Sleep(100 * time.Millisecond) {
		resp, err := s.call(domain, 1, d)
		if err == nil && len(resp.GetStatuses()) == 1 && resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() == requestsPerUnit {
			return
		}
		last = fmt.Sprintf("%v %v", resp, err)
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s %v: no limit of %d within %v (last answer: %s)\n%s", s.kind, domain, d, requestsPerUnit, waitTimeout, last, logtext.Tail(s.log(), 20))
		}
	}
}

// startEnvoy starts an Envoy of two workers whose own rate limit filter
// calls s, in front of a fresh upstream.
func startEnvoy(t *testing.T, s *service, rl envoy.RateLimit) *envoytest.Envoy {
	t.Helper()
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	return envoytest.Start(t, envoytest.Options{NoWasm: true, UpstreamPort: up.Port(), RLSPort: s.grpcPort,
		Concurrency: 2, RateLimit: &rl})
}

// untilEdge is how long until the next multiple of unit (a fixed window's
// edge, as both services count windows: Unix time divided by the unit).
func untilEdge(now time.Time, unit time.Duration) time.Duration {
	return now.Truncate(unit).Add(unit).Sub(now)
}

// alignSecond makes sure that at least need (under half a second) is left
// of the current second, waiting for the next second when less is: a few
// calls then see one second's window on every service. It waits less than
// a second; a play in a minute's or an hour's window uses inWindowOf,
// which waits for no edge.
func alignSecond(t *testing.T, need time.Duration) {
	t.Helper()
	if need > 500*time.Millisecond {
		t.Fatalf("alignSecond: need %v of a second (at most 500ms)", need)
	}
	if left := untilEdge(time.Now(), time.Second); left < need {
		time.Sleep(left + 50*time.Millisecond)
	}
}

// header returns the x-ratelimit-* headers of a result, for messages.
func rlHeaders(r envoytest.Result) string {
	var b strings.Builder
	for _, h := range []string{"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "x-envoy-ratelimited"} {
		if v := r.Header.Get(h); v != "" {
			fmt.Fprintf(&b, " %s=%q", h, v)
		}
	}
	return b.String()
}

// containsLine reports whether text has line as one of its lines.
func containsLine(text, line string) bool {
	return slices.Contains(strings.Split(text, "\n"), line)
}
