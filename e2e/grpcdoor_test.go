// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// limitd's gRPC door under attack, black-box: build/limitd (`make
// build-service`) over a real redis-server, with a token file, and the
// attacker internal/testing/grpcattack, a process of its own speaking raw
// HTTP/2 on loopback, while a gateway with the token calls ShouldRateLimit.
// Each test prints its figures (answered calls, RSS, CPU, connections
// closed) for the record; the assertions are loose (counts and bounds, no
// latency figure), as the machine is loaded.

// doorToken is the gateway's token (the token file's line "gw <token>").
const doorToken = "gw-door-secret"

// doorMemoryBound is the bound docs/operating-limitd.md states: whatever 1,024
// hostile connections do, limitd's RSS stays under it.
const doorMemoryBound = 512 << 20

// startDoorLimitd runs build/limitd with the gateway's token and extra.
func startDoorLimitd(t *testing.T, extra ...string) *rlqsLimitd {
	t.Helper()
	redis := redistest.Start(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("gw "+doorToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return startRLQSLimitd(t, redis.Addr(), append([]string{"--token-file", tokens}, extra...)...)
}

func (l *rlqsLimitd) pid() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cmd.Process.Pid
}

// attackReport is grpcattack's report.
type attackReport struct {
	Opened      int     `json:"opened"`
	Refused     int     `json:"refused"`
	Closed      int     `json:"closed"`
	ClosedAfter float64 `json:"closed_after_s"`
	Streams     int     `json:"streams"`
	DataBytes   int64   `json:"data_bytes"`
	Resets      int64   `json:"resets"`
	// The TLS modes' (handshakes, slowhello).
	Handshakes        int64   `json:"handshakes"`
	HandshakeFailures int64   `json:"handshake_failures"`
	HelloBytes        int64   `json:"hello_bytes"`
	Seconds           float64 `json:"seconds"`
}

// attacker is a running grpcattack.
type attacker struct {
	t      *testing.T
	cmd    *exec.Cmd
	out    syncBuffer
	errOut syncBuffer
	done   chan error
}

var (
	attackBinOnce sync.Once
	attackBin     string
	attackErr     error
)

// startAttack builds grpcattack (once) and starts it on limitd's gRPC port.
func startAttack(t *testing.T, l *rlqsLimitd, args ...string) *attacker {
	t.Helper()
	attackBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "grpcattack")
		if err != nil {
			attackErr = err
			return
		}
		attackBin = filepath.Join(dir, "grpcattack")
		if out, err := exec.Command("go", "build", "-o", attackBin, "../internal/testing/grpcattack").CombinedOutput(); err != nil {
			attackErr = err
			attackBin = string(out)
		}
	})
	if attackErr != nil {
		t.Fatalf("go build ./internal/testing/grpcattack: %v\n%s", attackErr, attackBin)
	}
	a := &attacker{t: t, done: make(chan error, 1)}
	a.cmd = exec.Command(attackBin, append([]string{"-addr", "127.0.0.1:" + strconv.Itoa(l.grpcPort)}, args...)...)
	a.cmd.Stdout, a.cmd.Stderr = &a.out, &a.errOut
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.done <- a.cmd.Wait() }()
	t.Cleanup(func() { a.kill() })
	return a
}

func (a *attacker) kill() { _ = a.cmd.Process.Kill() } // an error once it exited

// syncBuffer is a bytes.Buffer written by a process's output while the
// test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// wait waits for the attack's end (at most its duration and a minute) and
// returns its report.
func (a *attacker) wait() attackReport {
	a.t.Helper()
	select {
	case err := <-a.done:
		if err != nil {
			a.t.Fatalf("grpcattack: %v\n%s", err, a.errOut.String())
		}
	case <-time.After(3 * time.Minute):
		a.kill()
		a.t.Fatal("grpcattack did not end within 3 minutes")
	}
	var r attackReport
	if err := json.Unmarshal([]byte(a.out.String()), &r); err != nil {
		a.t.Fatalf("grpcattack's report %q: %v", a.out.String(), err)
	}
	return r
}

// waitDialed waits until the attacker has dialed every connection (its
// progress line on stderr) or ended.
func (a *attacker) waitDialed() {
	a.t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) { // polling with a deadline
		if strings.Contains(a.errOut.String(), "dialed") {
			return
		}
		select {
		case err := <-a.done:
			a.done <- err
			return
		default:
		}
	}
	a.t.Fatal("grpcattack did not finish dialing within 2 minutes")
}

// gateway calls ShouldRateLimit with the token over its own connection.
type gateway struct {
	t      *testing.T
	client pb.RateLimitServiceClient
}

func newGateway(t *testing.T, l *rlqsLimitd) *gateway {
	t.Helper()
	cc, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(l.grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &gateway{t: t, client: pb.NewRateLimitServiceClient(cc)}
}

// call makes one call (waiting for a connection, as Envoy's cluster does,
// up to timeout) and returns how long it took, or its error.
func (g *gateway) call(timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+doorToken), timeout)
	defer cancel()
	start := time.Now()
	_, err := g.client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: rlqsDomain,
		Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "user", Value: "gateway"}}}}},
		grpc.WaitForReady(true))
	return time.Since(start), err
}

// calls makes n calls one after the other and returns how many were
// answered and their latencies; it stops after three failures in a row.
func (g *gateway) calls(n int, timeout time.Duration) (answered int, took []time.Duration) {
	failed := 0
	for range n {
		d, err := g.call(timeout)
		if err != nil {
			if failed++; failed == 3 {
				g.t.Logf("gateway: three calls failed in a row, the last: %v", err)
				return answered, took
			}
			continue
		}
		failed = 0
		answered++
		took = append(took, d)
	}
	return answered, took
}

// quantile returns the q-quantile of ds (0 when empty).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// procStatus reads a field of /proc/<pid>/status, in bytes (the kB ones).
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status: no %s", pid, field)
	return 0
}

// cpuTime is the CPU time pid has used (user and system).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:])) // fields from the state on
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// Connections that send only the HTTP/2 preface, and ones holding a health
// Watch without a token, three times the cap, do not keep a gateway out:
// its new connection is served (the anonymous ones are evicted at the cap,
// Watch needs the token), and every anonymous connection is closed before
// the attack's end. The guard cannot tell a gateway's fresh connection
// from an attacker's before its first call is read: each is kept from
// eviction for --conn-grace; the holders' grace here (100 ms) is over long
// before the gateway connects.
func TestGRPCDoorHolders(t *testing.T) {
	t.Parallel()
	l := startDoorLimitd(t, "--grpc-max-conns", "32", "--conn-grace", "100ms")
	a := startAttack(t, l, "-mode", "holders", "-conns", "96", "-for", "20s")
	a.waitDialed()
	answered, took := newGateway(t, l).calls(60, 5*time.Second)
	r := a.wait()
	t.Logf("holders: %d connections opened, %d refused at the cap, %d of the opened closed by limitd (the last after %.1f s); gateway: %d of 60 answered, p50 %v, p99 %v",
		r.Opened, r.Refused, r.Closed, r.ClosedAfter, answered, quantile(took, 0.5), quantile(took, 0.99))
	if answered != 60 {
		t.Errorf("the gateway got %d of 60 calls answered, want 60", answered)
	}
	if r.Closed != r.Opened {
		t.Errorf("%d of %d anonymous connections still open at the end of their part of the attack", r.Opened-r.Closed, r.Opened)
	}
}

// The same holders, and Envoy 1.40's own rate limit filter with the token
// as the gateway (failure_mode_deny: a failed call is a 500), started while
// they hold: its 60 requests are answered 200, not 500, and every holder is
// closed before the attack's end.
func TestGRPCDoorHoldersEnvoy(t *testing.T) {
	t.Parallel()
	envoytest.Needs(t, false)
	l := startDoorLimitd(t, "--grpc-max-conns", "32", "--conn-grace", "100ms")
	a := startAttack(t, l, "-mode", "holders", "-conns", "96", "-for", "30s")
	a.waitDialed()
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{NoWasm: true, UpstreamPort: up.Port(), RLSPort: l.grpcPort, Concurrency: 2,
		RateLimit: &envoy.RateLimit{Domain: rlqsDomain, FailureModeDeny: true, Token: doorToken,
			RouteRateLimits: envoy.RateLimitsYAML(envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-user", "user")}})}})
	c := e.Client()
	defer c.Close()
	statuses := map[int]int{}
	for range 60 {
		statuses[c.Get("/", map[string]string{"x-user": "gateway"}).Status]++
	}
	r := a.wait()
	t.Logf("holders against Envoy: %d connections opened, %d refused at the cap, %d of the opened closed by limitd (the last after %.1f s); Envoy's answers %v",
		r.Opened, r.Refused, r.Closed, r.ClosedAfter, statuses)
	if statuses[200] != 60 {
		t.Errorf("Envoy answered %v, want 60 200s", statuses)
		for _, k := range []string{"cluster.rls.upstream_cx_total", "cluster.rls.upstream_cx_destroy_remote_with_active_rq", "cluster.upstream.ratelimit.error"} {
			t.Logf("Envoy's %s: %d", k, e.Stat(k))
		}
	}
	if r.Closed != r.Opened {
		t.Errorf("%d of %d anonymous connections still open at the end of their part of the attack", r.Opened-r.Closed, r.Opened)
	}
}

// 1,024 connections opening streams without a token, each sending most of
// a 64 KiB message that never ends: limitd's RSS stays under
// doorMemoryBound (read from /proc while it lasts; the attack stops if it
// passes it), every such connection is closed within 30 s of its dialing,
// and a gateway is served after. The streams are health Checks (open
// without a token: the connections live longest), or, mixed, every other
// one a ShouldRateLimit call.
func TestGRPCDoorUnfinishedMessages(t *testing.T) {
	t.Parallel()
	for _, mixed := range []bool{false, true} {
		t.Run("mixed="+strconv.FormatBool(mixed), func(t *testing.T) { testUnfinishedMessages(t, mixed) })
	}
}

func testUnfinishedMessages(t *testing.T, mixed bool) { testUnfinished(t, mixed, nil) }

// testUnfinished is testUnfinishedMessages, over TLS with p's files when
// p is set (grpctls_test.go).
func testUnfinished(t *testing.T, mixed bool, p *doorPKI) {
	l, attackTLS, newGW := startDoorLimitd(t), "-tls=false", newGateway
	if p != nil {
		l, attackTLS = startDoorLimitd(t, "--grpc-tls-cert", p.cert, "--grpc-tls-key", p.key), "-tls"
		newGW = func(t *testing.T, l *rlqsLimitd) *gateway { return newTLSGateway(t, l, p) }
	}
	pid := l.pid()
	base := procStatus(t, pid, "VmRSS")
	a := startAttack(t, l, "-mode", "unfinished", "-conns", "1024", "-streams", "8", "-for", "30s", "-mixed="+strconv.FormatBool(mixed), attackTLS)
	peak, over := base, false
	watch := time.NewTicker(100 * time.Millisecond)
	defer watch.Stop()
	for wait := true; wait; {
		select {
		case err := <-a.done:
			a.done <- err
			wait = false
		case <-watch.C:
			if rss := procStatus(t, pid, "VmRSS"); rss > peak {
				peak = rss
			}
			if peak > doorMemoryBound && !over {
				over = true
				a.kill() // the bound is passed: stop here
			}
		}
	}
	hwm := procStatus(t, pid, "VmHWM")
	if over {
		t.Fatalf("limitd's RSS passed %d MiB under the attack (%d MiB, from %d MiB)", doorMemoryBound>>20, peak>>20, base>>20)
	}
	r := a.wait()
	answered, _ := newGW(t, l).calls(10, 5*time.Second)
	t.Logf("unfinished messages (tls %v): %d connections opened, %d refused, %d streams, %d MiB of message sent; %d closed by limitd (the last after %.1f s); limitd's RSS %d MiB before, peak %d MiB (VmHWM %d MiB); gateway after: %d of 10 answered",
		p != nil, r.Opened, r.Refused, r.Streams, r.DataBytes>>20, r.Closed, r.ClosedAfter, base>>20, peak>>20, hwm>>20, answered)
	if hwm > doorMemoryBound {
		t.Errorf("limitd's peak RSS %d MiB, want under %d MiB", hwm>>20, doorMemoryBound>>20)
	}
	if r.Closed != r.Opened {
		t.Errorf("%d of %d anonymous connections still open at the end of their part of the attack", r.Opened-r.Closed, r.Opened)
	}
	if answered != 10 {
		t.Errorf("the gateway after the attack: %d of 10 answered", answered)
	}
}

// Four connections doing rapid reset (HEADERS, DATA, RST_STREAM), two with
// the token, are each closed by limitd, long before a million streams,
// while a gateway's calls go on being answered.
func TestGRPCDoorRapidReset(t *testing.T) {
	t.Parallel()
	l := startDoorLimitd(t)
	pid := l.pid()
	g := newGateway(t, l)
	if _, err := g.call(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	cpu0 := cpuTime(t, pid)
	start := time.Now()
	a := startAttack(t, l, "-mode", "reset", "-conns", "4", "-for", "15s", "-token", doorToken)
	var (
		answered, failed int
		took             []time.Duration
	)
	for busy := true; busy; {
		select {
		case err := <-a.done:
			a.done <- err
			busy = false
		default:
			if d, err := g.call(5 * time.Second); err != nil {
				failed++
			} else {
				answered++
				took = append(took, d)
			}
		}
	}
	cpu := cpuTime(t, pid) - cpu0
	elapsed := time.Since(start)
	r := a.wait()
	t.Logf("rapid reset: %d connections, %d streams reset, %d closed by limitd (the last after %.1f s); limitd used %v of CPU in %v; gateway: %d answered, %d failed, p50 %v, p99 %v",
		r.Opened, r.Resets, r.Closed, r.ClosedAfter, cpu.Round(10*time.Millisecond), elapsed.Round(100*time.Millisecond),
		answered, failed, quantile(took, 0.5), quantile(took, 0.99))
	if r.Closed != r.Opened || r.Opened != 4 {
		t.Errorf("%d of %d resetting connections closed, want all 4", r.Closed, r.Opened)
	}
	if failed > 0 {
		t.Errorf("the gateway: %d calls failed during the attack", failed)
	}
}
