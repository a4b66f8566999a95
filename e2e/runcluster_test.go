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
// build/limitd and build/plugin.wasm, on the fixed ports it uses. Then the
// README's session is replayed against those ports.
//
// The session is the README's fenced block whose info string is
// "console run-cluster": it renders as console, and TestExamples (which
// replays the "console" blocks of examples that need only Envoy, on free
// ports) leaves it alone.

// runClusterPorts are the loopback ports run.sh and envoy.yaml fix: Redis,
// limitd, Envoy's listener, the demo upstream and Envoy's admin.
var runClusterPorts = []int{6380, 8081, 10000, 10001, 9901}

var runClusterBlockRE = regexp.MustCompile("(?m)^```console run-cluster[ \t]*$")

// TestRunCluster starts examples/cluster-wide/run.sh, waits until Envoy and
// the limit service are ready, replays the README session, checks that Redis
// wrote its log where run.sh says, and that stopping the script stops
// everything it started.
//
// Wasm only: run.sh starts the example's Envoy configuration, which loads the Wasm filter.
func TestRunCluster(t *testing.T) {
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

	ownRunClusterPorts(t)
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
	cmd.Env = append(os.Environ(), "ENVOY_BIN="+envoyBin)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so that stopping it reaches every child even
	// if the script cannot; SIGTERM (which the script traps) if the test dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { stopRunCluster(t, cmd.Process.Pid, exited, logPath) })

	awaitRunCluster(t, exited, logPath)
	runSession(t, fixedRoute, cmds)

	if b, err := os.ReadFile(redisLog); err != nil || !strings.Contains(string(b), "Ready to accept connections") {
		t.Errorf("Redis log %s: %v\n%s", redisLog, err, b)
	}
	if code, body := httpGet(t, "http://127.0.0.1:8081/metrics"); code != 200 || !strings.Contains(body, "limitd_decisions_total") {
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

// ownRunClusterPorts takes a lock that every copy of this test on the machine
// shares (other checkouts included), then checks that each fixed port is
// free, so that the session talks to the processes this test starts. A busy
// port skips the test, or fails it with CI=true.
func ownRunClusterPorts(t *testing.T) { t.Helper(); ownFixedPorts(t, runClusterPorts) }

// ownFixedPorts is ownRunClusterPorts for another script's fixed ports
// (several share some: one lock for all of them).
func ownFixedPorts(t *testing.T, ports []int) {
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
	for _, p := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err == nil {
			ln.Close()
			continue
		}
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatalf("port %d, which run.sh uses, is busy: %v", p, err)
		}
		t.Skipf("port %d, which run.sh uses, is busy (%v); CI=true makes this a failure", p, err)
	}
}

// awaitRunCluster waits until Envoy's admin says LIVE and limitd's /readyz
// says 200, failing if the script exits first or after
// envoy.DefaultStartTimeout.
func awaitRunCluster(t *testing.T, exited chan error, logPath string) {
	t.Helper()
	awaitReady(t, exited, logPath, "http://127.0.0.1:8081/readyz", "ready")
}

// awaitReady is awaitRunCluster for another script whose service says
// want at serviceURL when ready.
func awaitReady(t *testing.T, exited chan error, logPath, serviceURL, want string) {
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
	for !ready("http://127.0.0.1:9901/ready", "LIVE") || !ready(serviceURL, want) {
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

// stopRunCluster stops the script as Ctrl-C would (SIGINT to its process
// group), then SIGKILLs whatever is left of the group after
// envoy.StopGrace, and fails t if a fixed port is still bound.
func stopRunCluster(t *testing.T, pid int, exited chan error, logPath string) {
	stopScript(t, pid, exited, logPath, runClusterPorts)
}

// stopScript is stopRunCluster for another script's fixed ports.
func stopScript(t *testing.T, pid int, exited chan error, logPath string, ports []int) {
	_ = syscall.Kill(-pid, syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(envoy.StopGrace):
		t.Errorf("run.sh did not stop within %v of SIGINT:\n%s", envoy.StopGrace, logtext.Tail(readFile(logPath), 20))
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL) // the group is empty unless something ignored SIGINT
	deadline := time.Now().Add(envoy.StopGrace)
	for _, p := range ports {
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
