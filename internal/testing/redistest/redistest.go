// Package redistest starts real redis-server processes on loopback ports for
// integration tests, end-to-end tests and benchmarks: a single server
// (Start, StartServer) and a Redis Cluster of three primaries (StartCluster,
// StartClusterServers), each with a kill and restart on the same ports for
// failure tests.
//
// Servers run without persistence (--save "" --appendonly no) in a temporary
// directory, bind 127.0.0.1 only, and die with the process that started them
// (SIGKILL on parent death, on Linux). Every wait is bounded: a server that is
// not answering PING within StartTimeout is an error.
//
// The test helpers (Start, StartCluster) skip the test when redis-server is
// not installed, unless the environment has CI=true, in which case they fail
// it: CI must not silently skip the Redis tests.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/loopback"
)

// StartTimeout bounds the wait for a server (or a cluster) to answer.
const StartTimeout = 10 * time.Second

// JoinTimeout bounds each wait on the cluster bus's gossip, which a loaded
// machine slows: redis-cli --cluster create's last step (it polls once a
// second until the nodes agree; a CI rehearsal at load about 7 was still
// waiting after StartTimeout) and WaitOK.
const JoinTimeout = 60 * time.Second

// Server is one redis-server process listening on 127.0.0.1.
type Server struct {
	port    int
	busPort int // cluster bus port; 0 outside a cluster
	dir     string
	args    []string

	ownDir bool // made by StartServer: removed by Stop

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been reaped
	log    *os.File
}

// Options configure StartServer.
type Options struct {
	// Dir holds the server's files (and its log, redis.log); it must exist.
	// Empty means a new temporary directory, removed by Stop.
	Dir string
	// Args are extra redis-server arguments, e.g. "--maxmemory", "10mb".
	Args []string
	// Cluster enables cluster mode (with a second free port for the bus).
	Cluster bool
}

// Installed reports whether redis-server (and redis-cli) are on PATH.
func Installed() bool {
	_, e1 := exec.LookPath("redis-server")
	_, e2 := exec.LookPath("redis-cli")
	return e1 == nil && e2 == nil
}

// StartServer starts a redis-server on a free loopback port and waits until it
// answers PING.
func StartServer(opts Options) (*Server, error) {
	if !Installed() {
		return nil, errors.New("redistest: redis-server or redis-cli: not on PATH")
	}
	dir := opts.Dir
	ownDir := dir == ""
	if ownDir {
		d, err := os.MkdirTemp("", "redistest-")
		if err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
		dir = d
	}
	var lastErr error
	for range 3 { // a free port can be taken between probing and binding
		s := &Server{dir: dir, args: opts.Args, ownDir: ownDir}
		var err error
		if s.port, err = loopback.FreePort(); err != nil {
			return nil, err
		}
		if opts.Cluster {
			if s.busPort, err = loopback.FreePort(); err != nil {
				return nil, err
			}
		}
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
	}
	if ownDir {
		os.RemoveAll(dir)
	}
	return nil, lastErr
}

// Addr returns the server's address, "127.0.0.1:<port>".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

func (s *Server) argv() []string {
	a := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--protected-mode", "yes",
		"--logfile", "",
	}
	if s.busPort != 0 {
		a = append(a,
			"--cluster-enabled", "yes",
			"--cluster-port", strconv.Itoa(s.busPort),
			"--cluster-config-file", "nodes-"+strconv.Itoa(s.port)+".conf",
			"--cluster-node-timeout", "2000",
		)
	}
	return append(a, s.args...)
}

// start launches the process on s's ports and waits for PING.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("redistest: %s: already running", s.Addr())
	}
	logf, err := os.OpenFile(filepath.Join(s.dir, "redis-"+strconv.Itoa(s.port)+".log"),
		os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	cmd := exec.Command("redis-server", s.argv()...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("redistest: redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited, s.log = cmd, exited, logf
	deadline := time.Now().Add(StartTimeout)
	for {
		if _, err := Do(s.Addr(), "PING"); err == nil {
			return nil
		}
		select {
		case <-exited:
			s.cmd, s.exited, s.log = nil, nil, nil
			logf.Close()
			return fmt.Errorf("redistest: redis-server on port %d exited at start:\n%s", s.port, s.logTail())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.killLocked()
			return fmt.Errorf("redistest: redis-server on port %d: no PONG within %v:\n%s", s.port, StartTimeout, s.logTail())
		}
	}
}

// logTail returns the end of the server's log, for error messages.
func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis-"+strconv.Itoa(s.port)+".log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Kill stops the server at once (SIGKILL), losing its data, as a crash would.
// The port stays reserved for Restart (nothing else should take it).
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	select { // reaped by the goroutine started with it
	case <-s.exited:
	case <-time.After(StartTimeout):
	}
	s.log.Close()
	s.cmd, s.exited, s.log = nil, nil, nil
}

// Restart starts a killed server again on the same port(s), empty (a cluster
// node keeps its node configuration file, so it rejoins its cluster).
func (s *Server) Restart() error { return s.start() }

// Running reports whether the process is up (it may not answer yet).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Stop kills the server and removes its directory if StartServer made it.
func (s *Server) Stop() {
	s.Kill()
	if s.ownDir {
		os.RemoveAll(s.dir)
	}
}

// Cluster is a Redis Cluster of three primaries (no replicas) on loopback.
type Cluster struct {
	Servers []*Server
	dir     string
}

// Addrs returns the primaries' addresses.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		a[i] = s.Addr()
	}
	return a
}

// Stop kills every node and removes the cluster's directory.
func (c *Cluster) Stop() {
	for _, s := range c.Servers {
		s.Kill()
	}
	os.RemoveAll(c.dir)
}

// WaitOK waits until every running node reports cluster_state:ok and knows
// all nodes, or JoinTimeout passes.
func (c *Cluster) WaitOK() error {
	deadline := time.Now().Add(JoinTimeout)
	for {
		var notOK []string
		for _, s := range c.Servers {
			if !s.Running() {
				continue
			}
			info, err := Do(s.Addr(), "CLUSTER", "INFO")
			if err != nil || !strings.Contains(info, "cluster_state:ok") ||
				!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.Servers))) {
				notOK = append(notOK, s.Addr())
			}
		}
		if len(notOK) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: cluster: %v not ok within %v", notOK, JoinTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StartClusterServers starts three cluster-enabled servers, joins them with
// redis-cli --cluster create (16384 slots over three primaries, no
// replicas), and waits until every node reports cluster_state:ok.
func StartClusterServers() (*Cluster, error) {
	dir, err := os.MkdirTemp("", "redistest-cluster-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	c := &Cluster{dir: dir}
	for range 3 {
		s, err := StartServer(Options{Dir: dir, Cluster: true})
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Servers = append(c.Servers, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cmd := exec.Command("redis-cli", args...)
	out, err := runBounded(cmd, JoinTimeout)
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.WaitOK(); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// runBounded runs cmd, killing it after timeout, and returns its output.
func runBounded(cmd *exec.Cmd, timeout time.Duration) ([]byte, error) {
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return []byte(buf.String()), err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return []byte(buf.String()), fmt.Errorf("timed out after %v", timeout)
	}
}

// Start starts a server for t and stops it when t ends. It skips t when
// redis-server is missing, or fails it if CI=true.
func Start(t testing.TB) *Server {
	t.Helper()
	need(t)
	s, err := StartServer(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartCluster starts a three-primary cluster for t and stops it when t ends.
// It skips t when redis-server is missing, or fails it if CI=true.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	need(t)
	c, err := StartClusterServers()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// Require skips t when redis-server is missing, or fails it if CI=true: for
// tests that start redis-server their own way.
func Require(t testing.TB) {
	t.Helper()
	need(t)
}

func need(t testing.TB) {
	t.Helper()
	if Installed() {
		return
	}
	ci.Skip(t, "redistest: redis-server and redis-cli are not installed (apt-get install redis-server)")
}

// Do sends one command to addr over a new go-redis connection and returns
// the reply as text (strings as they are, integers in decimal, arrays one
// element per line). An error reply is returned as an error. It is for
// probing servers, not for load.
func Do(addr string, args ...string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: 2 * time.Second,
		WriteTimeout: 2 * time.Second, MaxRetries: -1, PoolSize: 1, Protocol: 2, DisableIdentity: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	argv := make([]any, len(args))
	for i, a := range args {
		argv[i] = a
	}
	v, err := c.Do(ctx, argv...).Result()
	if err != nil {
		return "", err
	}
	return replyText(v), nil
}

func replyText(v any) string {
	if parts, ok := v.([]any); ok {
		lines := make([]string, len(parts))
		for i, p := range parts {
			lines[i] = replyText(p)
		}
		return strings.Join(lines, "\n")
	}
	return fmt.Sprint(v)
}
