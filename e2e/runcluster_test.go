// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// `make run-cluster` (examples/cluster-wide/run.sh) is tested as a user runs
// it: the script itself, from the repository root, with a real redis-server,
// build/limitd and build/plugin.wasm, on the ports it fixes moved by
// PORT_OFFSET (movedPorts), so that a `make run` or `make run-cluster`
// beside `make test` keeps its own. Then the README's session is replayed
// against those ports.
//
// The session is the README's fenced block whose info string is
// "console run-cluster": it renders as console, and TestExamples (which
// replays the "console" blocks of examples that need only Envoy, on free
// ports) leaves it alone.

// runClusterPorts are the loopback ports run.sh and envoy.yaml fix: Redis,
// limitd, Envoy's listener, the demo upstream and Envoy's admin.
var runClusterPorts = []int{6380, 8429, 10000, 10001, 9901}

var runClusterBlockRE = regexp.MustCompile("(?m)^```console run-cluster[ \t]*$")

// TestRunCluster starts examples/cluster-wide/run.sh, waits until Envoy and
// the limit service are ready, replays the README session, checks that Redis
// wrote its log where run.sh says, and that stopping the script stops
// everything it started.
//
// Wasm only: run.sh starts the example's Envoy configuration, which loads the Wasm filter.
func TestRunCluster(t *testing.T) {
	t.Parallel()
	envoyBin := envoytest.EnvoyBin(t)
	redistest.Require(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ path, hint string }{
		{"build/plugin.wasm", "make build"},
		{"build/limitd", "make build-service"},
		{"build/bin/func-e", "make setup"},
	} {
		needFile(t, filepath.Join(root, f.path), f.hint)
	}
	cmds := runClusterSession(t, filepath.Join(root, "examples", "cluster-wide", "README.md"))

	mp := ownRunClusterPorts(t)
	logPath := filepath.Join(t.TempDir(), "run.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	redisLog := filepath.Join(root, "build", "run-cluster", "redis.log")
	if err := os.Remove(redisLog); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "examples", "cluster-wide", "run.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "ENVOY_BIN="+envoyBin, mp.env())
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so that stopping it reaches every child even
	// if the script cannot; SIGTERM (which the script traps) if the test dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { stopScript(t, cmd.Process.Pid, exited, logPath, mp) })

	awaitReady(t, exited, logPath, mp, mp.url("http://127.0.0.1:8429/readyz"), "ready")
	runSession(t, mp.route, cmds, 0)

	if b, err := os.ReadFile(redisLog); err != nil || !strings.Contains(string(b), "Ready to accept connections") {
		t.Errorf("Redis log %s: %v\n%s", redisLog, err, b)
	}
	if code, body := httpGet(t, mp.url("http://127.0.0.1:8429/metrics")); code != 200 || !strings.Contains(body, "limitd_decisions_total") {
		t.Errorf("limitd /metrics: %d, no limitd_decisions_total", code)
	}
	if log := readFile(logPath); !strings.Contains(log, `"store":"redis"`) {
		t.Errorf("limitd did not run on Redis:\n%s", logtext.Tail(log, 30))
	}
}

// needFile returns when path exists; else it skips t, or fails it with CI=true.
func needFile(t *testing.T, path, hint string) {
	t.Helper()
	if _, err := os.Stat(path); err == nil {
		return
	}
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("%s is missing (run `%s`)", path, hint)
	}
	t.Skipf("%s is missing (run `%s`; CI=true makes this a failure)", path, hint)
}

// movedPorts are the ports a run script fixes, each moved by offset: the
// scripts take PORT_OFFSET and add it to every port they and their Envoy
// configuration use. The tests run them at an offset from portOffsets, so
// that they never meet the demo's ports (10000, 9901, 8429, ...) of a `make
// run` or `make run-cluster` running beside `make test`.
type movedPorts struct {
	offset int
	ports  []int // as the script fixes them
}

// portOffsets are the offsets the tests try, first to last: from 11000 the
// scripts' ports (6070 to 10001) land in 17070..30001, away from the
// demo's and below Linux's ephemeral range (32768 and up), which the
// kernel lends to outgoing connections: under the load tests' connection
// churn, thousands of those ports sit in TIME_WAIT at once, and a socket in
// TIME_WAIT that was not bound with SO_REUSEADDR (a client's) refuses a
// listener the port (offsets from 40000 found all ten busy on a loaded
// machine). A port still taken moves the test to the next offset.
var portOffsets = []int{11000, 12000, 13000, 14000, 15000, 16000, 17000, 18000, 19000, 20000}

func (m movedPorts) env() string { return "PORT_OFFSET=" + strconv.Itoa(m.offset) }

// moved is the script's ports as they are bound.
func (m movedPorts) moved() []int {
	out := make([]int, len(m.ports))
	for i, p := range m.ports {
		out[i] = p + m.offset
	}
	return out
}

// url moves the port of a loopback URL a README or a test names.
func (m movedPorts) url(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		return raw
	}
	u.Host = u.Hostname() + ":" + strconv.Itoa(p+m.offset)
	return u.String()
}

// route is fixedRoute to the moved port; the authority stays the README's.
func (m movedPorts) route(raw string) (string, string, error) {
	to, authority, err := fixedRoute(raw)
	if err != nil {
		return "", "", err
	}
	return m.url(to), authority, nil
}

// ownRunClusterPorts takes a lock that every copy of this test on the machine
// shares (other checkouts included), then picks the first offset at which
// every port run.sh fixes is free, so that the session talks to the
// processes this test starts. No free offset fails the test: it never skips.
func ownRunClusterPorts(t *testing.T) movedPorts {
	t.Helper()
	return ownFixedPorts(t, runClusterPorts)
}

// ownFixedPorts is ownRunClusterPorts for another script's fixed ports
// (several share some: one lock for all of them).
func ownFixedPorts(t *testing.T, ports []int) movedPorts {
	t.Helper()
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "tokenbucket-run-cluster.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			lock.Close()
			t.Fatalf("lock %s: %v", lock.Name(), err)
		}
		time.Sleep(100 * time.Millisecond) // another run of this test holds the ports
	}
	t.Cleanup(func() { lock.Close() }) // closing releases the lock, after the processes stopped
	var busy []string
offsets:
	for _, off := range portOffsets {
		m := movedPorts{offset: off, ports: ports}
		for _, p := range m.moved() {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				busy = append(busy, fmt.Sprintf("%d (%v)", p, err))
				continue offsets
			}
			ln.Close()
		}
		return m
	}
	t.Fatalf("no offset in %v leaves every port of %v free: busy %s", portOffsets, ports, strings.Join(busy, ", "))
	return movedPorts{}
}

// awaitReady waits until Envoy's admin (port 9901, moved) says LIVE and the
// script's service says want at serviceURL, failing if the script exits
// first or after envoy.DefaultStartTimeout.
func awaitReady(t *testing.T, exited chan error, logPath string, mp movedPorts, serviceURL, want string) {
	t.Helper()
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	ready := func(url, want string) bool {
		resp, err := hc.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return resp.StatusCode == 200 && strings.Contains(string(b), want)
	}
	deadline := time.Now().Add(envoy.DefaultStartTimeout)
	admin := mp.url("http://127.0.0.1:9901/ready")
	for !ready(admin, "LIVE") || !ready(serviceURL, want) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("run.sh exited before it was ready (%v):\n%s", err, logtext.Tail(readFile(logPath), 40))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after %v:\n%s", envoy.DefaultStartTimeout, logtext.Tail(readFile(logPath), 40))
		}
		time.Sleep(100 * time.Millisecond) // polling readiness with a deadline
	}
}

// stopScript stops the script as Ctrl-C would (SIGINT to its process
// group), then SIGKILLs whatever is left of the group after
// envoy.StopGrace, and fails t if a port of mp is still bound.
func stopScript(t *testing.T, pid int, exited chan error, logPath string, mp movedPorts) {
	_ = syscall.Kill(-pid, syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(envoy.StopGrace):
		t.Errorf("run.sh did not stop within %v of SIGINT:\n%s", envoy.StopGrace, logtext.Tail(readFile(logPath), 20))
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL) // the group is empty unless something ignored SIGINT
	deadline := time.Now().Add(envoy.StopGrace)
	for _, p := range mp.moved() {
		for {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err == nil {
				ln.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("port %d still bound after run.sh stopped: %v", p, err)
				break
			}
			time.Sleep(50 * time.Millisecond) // the kernel releases the socket when the process is reaped
		}
	}
	if t.Failed() {
		t.Logf("run.sh output:\n%s", logtext.Tail(readFile(logPath), 60))
	}
}

// runClusterSession returns the commands of the README's "console
// run-cluster" blocks, with their README line numbers.
func runClusterSession(t *testing.T, readme string) []sessionCmd {
	t.Helper()
	return scriptSession(t, readme, runClusterBlockRE)
}

// scriptSession is runClusterSession for the blocks block matches.
func scriptSession(t *testing.T, readme string, block *regexp.Regexp) []sessionCmd {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	// Make those blocks the only console blocks, line for line, and let
	// the examples' session parser read them.
	text := consoleBlockRE.ReplaceAllString(string(b), "```text")
	text = block.ReplaceAllString(text, "```console")
	cmds, err := parseSessions(text)
	if err != nil {
		t.Fatalf("%s: %v", readme, err)
	}
	if len(cmds) == 0 {
		t.Fatalf("%s: no session matching %s", readme, block)
	}
	return cmds
}

// fixedRoute sends a README's URL where it says, to loopback only: the
// ports run.sh fixes are the real ones here.
func fixedRoute(raw string) (string, string, error) {
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", err
	}
	if h := u.Hostname(); h != "localhost" && h != "127.0.0.1" {
		return "", "", fmt.Errorf("URL %s: only loopback", raw)
	}
	authority := u.Host              // what curl sends
	u.Host = "127.0.0.1:" + u.Port() // localhost may resolve to ::1 first
	return u.String(), authority, nil
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
