// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package envoyratelimit starts envoyproxy/ratelimit, the rate limit service
// Envoy's own rate limit filter (envoy.filters.http.ratelimit) is usually
// paired with, as a child process for the tests and benchmarks that check
// limitd's rate limit service API against it.
//
// The binary is built from source by `make build-ratelimit`
// (build/envoy-ratelimit/service_cmd, mk/ratelimit.mk): [Binary] finds it through
// $RATELIMIT_BIN, which the Makefile exports, else in the build directory of
// the checkout that holds the working directory.
//
// The server is configured only through its environment, the way its own
// documentation runs it: Redis over TCP at Options.RedisAddr (REDIS_URL,
// REDIS_SOCKET_TYPE=tcp), no statsd (USE_STATSD=false), its gRPC, HTTP and
// debug listeners on free 127.0.0.1 ports (GRPC_HOST, GRPC_PORT, HOST, PORT,
// DEBUG_HOST, DEBUG_PORT), and its configuration files read from
// $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config/ with RUNTIME_WATCH_ROOT=false, so
// that a file written there ([Server.WriteConfig]) is loaded without a
// restart. Options.Env adds to or overrides any of these.
//
// [StartServer] waits until the first configuration has been loaded (or
// refused: see [Server.ConfigErrors]), GET /healthcheck answers 200 and the
// gRPC port accepts connections; every wait is bounded. The process dies
// with the process that started it (SIGKILL on parent death, on Linux);
// [Server.Stop] sends SIGTERM, then SIGKILL after StopGrace.
//
// The test helper [Start] skips the test when the binary is missing, unless
// CI=true, where it fails it: CI must not silently skip the differential
// tests.
package envoyratelimit

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
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
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/loopback"
)

const (
	// StartTimeout bounds the wait for a started server to be ready. The
	// server itself starts in well under a second; the bound is for a loaded
	// 2-core machine.
	StartTimeout = 60 * time.Second
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL.
	StopGrace = 10 * time.Second
	// Subdirectory is RUNTIME_SUBDIRECTORY: the files are in
	// <Dir>/ratelimit/config/.
	Subdirectory = "ratelimit"
	// Version is the version of envoyproxy/ratelimit that `make
	// build-ratelimit` builds (mk/ratelimit.mk's RATELIMIT_VERSION).
	Version = "v1.4.1-0.20260122083618-3fb702589d36"

	// LoadedLine and RefusedLine are what the server logs (at level info
	// and error) when it loaded a set of configuration files, or refused
	// one; the refusal is followed by "<file key>: <reason>".
	LoadedLine  = "Successfully loaded new configuration"
	RefusedLine = "Error loading new configuration"

	pollInterval  = 20 * time.Millisecond
	startAttempts = 3       // new ports when one chosen by FreePort was taken
	maxBody       = 1 << 20 // bounds what is read from the server's HTTP answers
)

// Options configure StartServer.
type Options struct {
	// RedisAddr is the Redis server, "host:port" (REDIS_URL over TCP).
	// Required: the server does not start without its store.
	RedisAddr string
	// Configs are the configuration files written before the start, by
	// file name (e.g. "limits.yaml") to YAML text.
	Configs map[string]string
	// Dir is RUNTIME_ROOT, where the files and the log (ratelimit.log) go.
	// Empty means a new temporary directory, removed by Stop.
	Dir string
	// Env is added to the server's environment ("KEY=value" each; a key
	// given here wins over the defaults above), e.g.
	// "NEAR_LIMIT_RATIO=0.5" or "LOCAL_CACHE_SIZE_IN_BYTES=1048576".
	Env []string
	// Binary is the server's path; "" means Binary(). Another server
	// configured as this one is (limitd's build/ratelimit) may run here.
	Binary string
	// ConfiguredLines, when set, are the log lines that say the first
	// configuration was loaded or refused (LoadedLine and RefusedLine
	// otherwise): another Binary's.
	ConfiguredLines []string
	// StartTimeout bounds the wait for readiness; 0 means StartTimeout.
	StartTimeout time.Duration
}

// Server is one running envoyproxy/ratelimit. Its methods are safe for
// concurrent use.
type Server struct {
	grpcPort, httpPort, debugPort int
	dir, logPath                  string
	ownDir                        bool

	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has been reaped
	waitErr error         // cmd.Wait's, valid once done is closed
	http    *http.Client
	once    sync.Once
	stopped atomic.Bool
}

// Binary returns the server's path: $RATELIMIT_BIN, else
// build/envoy-ratelimit/service_cmd of the checkout that holds the working
// directory. The error says how to build it.
func Binary() (string, error) {
	p := os.Getenv("RATELIMIT_BIN")
	if p == "" {
		p = checkoutFile("build", "envoy-ratelimit", "service_cmd")
	}
	if st, err := os.Stat(p); p == "" || err != nil || st.IsDir() {
		return "", fmt.Errorf("envoyratelimit: RATELIMIT_BIN=%q names no program (run `make build-ratelimit`)", p)
	}
	return p, nil
}

// checkoutFile joins elem to the root of the checkout that holds the
// working directory (the directory of the go.mod of module
// github.com/ratelimit-wasm/tokenbucket, found upwards), or returns "".
func checkoutFile(elem ...string) string {
	dir, err := os.Getwd()
	for err == nil {
		if b, e := os.ReadFile(filepath.Join(dir, "go.mod")); e == nil &&
			bytes.HasPrefix(b, []byte("module github.com/ratelimit-wasm/tokenbucket\n")) {
			return filepath.Join(append([]string{dir}, elem...)...)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return ""
}

// StartServer writes opts.Configs, starts the server on free loopback ports
// and waits until it is ready (see the package documentation).
func StartServer(opts Options) (*Server, error) {
	if opts.RedisAddr == "" {
		return nil, errors.New("envoyratelimit: Options.RedisAddr: empty (the server needs a Redis server)")
	}
	bin := opts.Binary
	if bin == "" {
		var err error
		if bin, err = Binary(); err != nil {
			return nil, err
		}
	}
	dir, ownDir := opts.Dir, opts.Dir == ""
	if ownDir {
		d, err := os.MkdirTemp("", "envoyratelimit-")
		if err != nil {
			return nil, fmt.Errorf("envoyratelimit: %w", err)
		}
		dir = d
	}
	cleanup := func() {
		if ownDir {
			os.RemoveAll(dir)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, Subdirectory, "config"), 0o755); err != nil {
		cleanup()
		return nil, fmt.Errorf("envoyratelimit: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(opts.Configs)) {
		if err := writeConfig(dir, name, opts.Configs[name]); err != nil {
			cleanup()
			return nil, err
		}
	}
	var lastErr error
	for range startAttempts {
		s := &Server{dir: dir, ownDir: ownDir, logPath: filepath.Join(dir, "ratelimit.log"), done: make(chan struct{}),
			http: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2}}}
		for _, p := range []*int{&s.grpcPort, &s.httpPort, &s.debugPort} {
			var err error
			if *p, err = loopback.FreePort(); err != nil {
				cleanup()
				return nil, err
			}
		}
		if lastErr = s.start(bin, opts); lastErr == nil {
			return s, nil
		}
		log := s.Log()
		s.kill()
		if !strings.Contains(log, "address already in use") {
			break
		}
	}
	cleanup()
	return nil, lastErr
}

// env is the server's environment: this process's, the defaults, then opts.Env.
func (s *Server) env(opts Options) []string {
	env := append(os.Environ(),
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL="+opts.RedisAddr,
		"USE_STATSD=false",
		"LOG_LEVEL=info", // the configuration loads are logged at info
		"LOG_FORMAT=text",
		"RUNTIME_ROOT="+s.dir,
		"RUNTIME_SUBDIRECTORY="+Subdirectory,
		"RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false",
		"RUNTIME_IGNOREDOTFILES=true",
		"HOST=127.0.0.1", "PORT="+strconv.Itoa(s.httpPort),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(s.grpcPort),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(s.debugPort),
	)
	return append(env, opts.Env...) // the last of a repeated key wins
}

func (s *Server) start(bin string, opts Options) error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("envoyratelimit: %w", err)
	}
	s.cmd = exec.Command(bin)
	s.cmd.Dir = s.dir
	s.cmd.Env = s.env(opts)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	setDeathSignal(s.cmd)
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("envoyratelimit: start %s: %w", bin, err)
	}
	go func() {
		defer close(s.done)
		s.waitErr = s.cmd.Wait()
		logf.Close()
	}()
	lines := opts.ConfiguredLines
	if len(lines) == 0 {
		lines = []string{LoadedLine, RefusedLine}
	}
	return s.waitReady(cmp.Or(opts.StartTimeout, StartTimeout), lines)
}

// waitReady waits for the first configuration outcome, /healthcheck and
// the gRPC port.
func (s *Server) waitReady(timeout time.Duration, configuredLines []string) error {
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for {
		if err := s.exited(); err != nil {
			return fmt.Errorf("%w:\n%s", err, logtext.Tail(s.Log(), 30))
		}
		log := s.Log()
		configured := slices.ContainsFunc(configuredLines, func(l string) bool { return strings.Contains(log, l) })
		body, code, err := s.get(s.HTTPURL("/healthcheck"))
		switch {
		case err != nil:
			last = err.Error()
		case code != http.StatusOK:
			last = fmt.Sprintf("/healthcheck: %d %.100s", code, body)
		case !configured:
			last = "no configuration loaded or refused yet"
		default:
			c, err := net.DialTimeout("tcp", s.GRPCAddr(), time.Second)
			if err == nil {
				c.Close()
				return nil
			}
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("envoyratelimit: not ready within %v: %s\n%s", timeout, last, logtext.Tail(log, 30))
		}
		time.Sleep(pollInterval)
	}
}

func (s *Server) exited() error {
	select {
	case <-s.done:
		return fmt.Errorf("envoyratelimit: server exited: %v", s.waitErr)
	default:
		return nil
	}
}

// Exited reports whether the process has exited.
func (s *Server) Exited() bool { return s.exited() != nil }

// GRPCAddr is the address of the rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService), "127.0.0.1:<port>".
func (s *Server) GRPCAddr() string { return "127.0.0.1:" + strconv.Itoa(s.grpcPort) }

// GRPCPort is the gRPC listener's port.
func (s *Server) GRPCPort() int { return s.grpcPort }

// HTTPURL is the URL of path on the HTTP listener (/healthcheck, /json).
func (s *Server) HTTPURL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(s.httpPort) + path
}

// DebugURL is the URL of path on the debug listener (/rlconfig).
func (s *Server) DebugURL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(s.debugPort) + path
}

// Dir is RUNTIME_ROOT.
func (s *Server) Dir() string { return s.dir }

// ConfigDir is the directory the server loads its files from.
func (s *Server) ConfigDir() string { return filepath.Join(s.dir, Subdirectory, "config") }

// WriteConfig writes (or replaces) the file name in ConfigDir atomically
// (written beside, then renamed in), which the server notices and loads.
func (s *Server) WriteConfig(name, yaml string) error { return writeConfig(s.dir, name, yaml) }

func writeConfig(dir, name, yaml string) error {
	if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, ".") {
		return fmt.Errorf("envoyratelimit: config file name %q: want a plain file name", name)
	}
	tmp := filepath.Join(dir, "."+name+".tmp") // outside the watched directory
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		return fmt.Errorf("envoyratelimit: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, Subdirectory, "config", name)); err != nil {
		return fmt.Errorf("envoyratelimit: %w", err)
	}
	return nil
}

// RemoveConfig removes the file name from ConfigDir.
func (s *Server) RemoveConfig(name string) error {
	if err := os.Remove(filepath.Join(s.ConfigDir(), name)); err != nil {
		return fmt.Errorf("envoyratelimit: %w", err)
	}
	return nil
}

// LoadedConfig is the configuration the server runs, as its debug
// listener's /rlconfig prints it: one line per limit,
// "<domain>.<key>_<value>...: unit=MINUTE requests_per_unit=40, shadow_mode: false, ...".
// It is empty when no configuration has been loaded.
func (s *Server) LoadedConfig() (string, error) {
	body, code, err := s.get(s.DebugURL("/rlconfig"))
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("status %d: %.200s", code, body)
	}
	if err != nil {
		return "", fmt.Errorf("envoyratelimit: /rlconfig: %w", err)
	}
	return string(body), nil
}

// Loads and ConfigErrors count the configurations the server loaded and
// refused so far, from its log; ConfigErrors returns the refusals' lines.
func (s *Server) Loads() int { return strings.Count(s.Log(), LoadedLine) }

func (s *Server) ConfigErrors() []string {
	var lines []string
	for _, l := range strings.Split(s.Log(), "\n") {
		if strings.Contains(l, RefusedLine) {
			lines = append(lines, l)
		}
	}
	return lines
}

// WaitLoads waits until the server has loaded n configurations (the one at
// the start counts), or refused one more than it had when called with
// refusedBefore = len(ConfigErrors()) (then the error names the refusal).
func (s *Server) WaitLoads(n, refusedBefore int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if s.Loads() >= n {
			return nil
		}
		if errs := s.ConfigErrors(); len(errs) > refusedBefore {
			return fmt.Errorf("envoyratelimit: configuration refused: %s", errs[len(errs)-1])
		}
		if err := s.exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("envoyratelimit: %d configuration loads within %v, want %d", s.Loads(), timeout, n)
		}
		time.Sleep(pollInterval)
	}
}

// WaitRefused waits until the server has refused more than refusedBefore
// configurations and returns the last refusal's log line.
func (s *Server) WaitRefused(refusedBefore int, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		if errs := s.ConfigErrors(); len(errs) > refusedBefore {
			return errs[len(errs)-1], nil
		}
		if err := s.exited(); err != nil {
			return "", err
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("envoyratelimit: no configuration refused within %v", timeout)
		}
		time.Sleep(pollInterval)
	}
}

// Counters are the server's statistics counters so far, by their names
// ("ratelimit.service.rate_limit.<domain>.<key>_<value>....over_limit"),
// summed from its log: without statsd (USE_STATSD=false) the server logs
// each counter's increase at every flush. The flush comes every
// STATS_FLUSH_INTERVAL (10s unless Options.Env sets it, e.g.
// "STATS_FLUSH_INTERVAL=100ms"); see WaitCountersSettled.
func (s *Server) Counters() map[string]float64 {
	m := map[string]float64{}
	for _, l := range strings.Split(s.Log(), "\n") {
		if !strings.Contains(l, `"msg":"flushing counter"`) {
			continue
		}
		var rec struct {
			JSON struct {
				Name  string `json:"name"`
				Value string `json:"value"`
			} `json:"json"`
		}
		if json.Unmarshal([]byte(l), &rec) != nil {
			continue
		}
		if v, err := strconv.ParseFloat(rec.JSON.Value, 64); err == nil && rec.JSON.Name != "" {
			m[rec.JSON.Name] += v
		}
	}
	return m
}

// WaitCountersSettled waits until the counters whose names start with
// prefix have stayed the same over settle (a few flush intervals) and
// returns them, or returns what it has after timeout.
func (s *Server) WaitCountersSettled(prefix string, settle, timeout time.Duration) map[string]float64 {
	pick := func() map[string]float64 {
		m := map[string]float64{}
		for k, v := range s.Counters() {
			if strings.HasPrefix(k, prefix) {
				m[k] = v
			}
		}
		return m
	}
	deadline := time.Now().Add(timeout)
	last, since := pick(), time.Now()
	for time.Now().Before(deadline) {
		time.Sleep(pollInterval * 5)
		cur := pick()
		if !maps.Equal(cur, last) {
			last, since = cur, time.Now()
			continue
		}
		if len(cur) > 0 && time.Since(since) >= settle {
			break
		}
	}
	return last
}

// JSON posts body (a RateLimitRequest in protobuf's JSON form, e.g.
// {"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}) to
// the server's /json endpoint and returns the status and the answer (a
// RateLimitResponse in JSON: overallCode "OK" or "OVER_LIMIT", statuses).
func (s *Server) JSON(body string) (int, string, error) {
	resp, err := s.http.Post(s.HTTPURL("/json"), "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", fmt.Errorf("envoyratelimit: /json: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	return resp.StatusCode, string(b), err
}

func (s *Server) get(url string) ([]byte, int, error) {
	resp, err := s.http.Get(url)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	return b, resp.StatusCode, err
}

// Log is what the server wrote to stdout and stderr so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

// PID is the server's process id (a child of this process).
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Stop sends SIGTERM, then SIGKILL after StopGrace, and removes a temporary
// Dir. It is idempotent.
func (s *Server) Stop() {
	s.once.Do(func() {
		s.stopped.Store(true)
		if !s.Exited() {
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-s.done:
		case <-time.After(StopGrace):
			s.kill()
		}
		s.http.CloseIdleConnections()
		if s.ownDir {
			os.RemoveAll(s.dir)
		}
	})
}

// kill ends the process at once and waits until it is reaped.
func (s *Server) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-s.done:
	case <-time.After(StopGrace):
	}
}

// Require returns the server's binary, skipping t when it is missing (or
// failing t under CI=true).
func Require(t testing.TB) string {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		ci.Skip(t, "%v", err)
	}
	return bin
}

// Start starts a server for t (see StartServer; Dir defaults to a directory
// of t's, kept for the log) and stops it when t ends, logging the end of
// its log if t failed. It skips t when the binary is missing, or fails it
// under CI=true.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Binary == "" {
		opts.Binary = Require(t)
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	s, err := StartServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s.Exited() && !s.stopped.Load() {
			t.Errorf("envoyratelimit: the server exited during the test: %v\n%s", s.waitErr, logtext.Tail(s.Log(), 30))
		} else if t.Failed() {
			t.Logf("envoyratelimit: the test failed; the server's log tail:\n%s", logtext.Tail(s.Log(), 30))
		}
		s.Stop()
	})
	return s
}
