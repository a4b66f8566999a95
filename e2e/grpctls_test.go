// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/testpki"
)

// limitd's gRPC door over mutual TLS, as Envoy Gateway runs its rate limit
// service (GRPC_SERVER_USE_TLS with a server certificate and the CA of
// Envoy's client certificate): build/limitd with --grpc-tls-cert,
// --grpc-tls-key, --grpc-tls-client-ca and --grpc-tls-client-san.

// doorPKI are the files of a CA, limitd's certificate, Envoy's client
// certificate (named as Envoy Gateway's certgen names it: CN envoy, DNS
// *.NAMESPACE), one of another CA and an expired one.
type doorPKI struct {
	ca, cert, key             string
	envoyCert, envoyKey       string
	strangerCert, strangerKey string
	expiredCert, expiredKey   string
	clientSAN, envoyCaller    string
}

func newDoorPKI(t *testing.T) *doorPKI {
	t.Helper()
	now := time.Now()
	ca, err := testpki.NewCA(t.TempDir(), "ca", now)
	if err != nil {
		t.Fatal(err)
	}
	other, err := testpki.NewCA(t.TempDir(), "other", now)
	if err != nil {
		t.Fatal(err)
	}
	p := &doorPKI{ca: ca.File, clientSAN: "envoy.envoy-gateway-system", envoyCaller: "*.envoy-gateway-system"}
	must := func(cert, key string, err error) (string, string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return cert, key
	}
	envoyLeaf := testpki.Leaf{CN: "envoy", DNS: []string{p.envoyCaller}}
	p.cert, p.key = must(ca.Issue("limitd", testpki.Loopback("envoy-gateway-ratelimit"), now))
	p.envoyCert, p.envoyKey = must(ca.Issue("envoy", envoyLeaf, now))
	p.strangerCert, p.strangerKey = must(other.Issue("stranger", envoyLeaf, now))
	expired := envoyLeaf
	expired.NotBefore, expired.NotAfter = now.Add(-48*time.Hour), now.Add(-24*time.Hour)
	p.expiredCert, p.expiredKey = must(ca.Issue("expired", expired, now))
	return p
}

// startTLSLimitd is startDoorLimitd (the gateway's token file too) serving
// mutual TLS with p's files.
func startTLSLimitd(t *testing.T, p *doorPKI, extra ...string) *rlqsLimitd {
	t.Helper()
	return startDoorLimitd(t, append([]string{"--grpc-tls-cert", p.cert, "--grpc-tls-key", p.key,
		"--grpc-tls-client-ca", p.ca, "--grpc-tls-client-san", p.clientSAN}, extra...)...)
}

// newTLSGateway is newGateway over mutual TLS with Envoy's certificate.
func newTLSGateway(t *testing.T, l *rlqsLimitd, p *doorPKI) *gateway {
	t.Helper()
	cfg, err := testpki.ClientConfig("127.0.0.1", p.envoyCert, p.envoyKey, p.ca)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(l.grpcPort), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &gateway{t: t, client: pb.NewRateLimitServiceClient(cc)}
}

// metric reads a series' value from limitd's /metrics (-1 when absent).
func (l *rlqsLimitd) metric(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(l.httpPort) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// Envoy 1.40's rate limit filter calls limitd over mutual TLS, its cluster
// configured as Envoy Gateway configures it (an UpstreamTlsContext with the
// CA and a client certificate, no token): limitd's answers reach the
// client (40 of 45 requests of a key limited to 40 a minute admitted, with
// what refilled meanwhile, the rest 429; failure_mode_deny would make a
// failed call a 500), counted under the caller the certificate names.
func TestGRPCDoorMutualTLSEnvoy(t *testing.T) {
	t.Parallel()
	envoytest.Needs(t, false)
	p := newDoorPKI(t)
	l := startTLSLimitd(t, p)
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{NoWasm: true, UpstreamPort: up.Port(), RLSPort: l.grpcPort, Concurrency: 2,
		Data: map[string]any{"rls_tls": map[string]any{"ca": p.ca, "cert": p.envoyCert, "key": p.envoyKey}},
		RateLimit: &envoy.RateLimit{Domain: rlqsDomain, FailureModeDeny: true,
			RouteRateLimits: envoy.RateLimitsYAML(envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-api-key", "api_key")}})}})
	c := e.Client()
	defer c.Close()
	statuses := map[int]int{}
	start := time.Now()
	for range 45 {
		statuses[c.Get("/", map[string]string{"x-api-key": "k-tls"}).Status]++
	}
	// 40 a minute refills a token every 1.5 s: a loaded machine may take
	// that long over the 45 requests.
	refill := int(time.Since(start).Seconds() / 1.5)
	authorized := l.metric(t, `limitd_rls_authorized_calls_total{caller="`+p.envoyCaller+`"}`)
	t.Logf("Envoy over mutual TLS: answers %v; limitd counted %v calls of %s, %v failed handshakes (the start's port probes)",
		statuses, authorized, p.envoyCaller, l.metric(t, "limitd_grpc_tls_handshake_failures_total"))
	if statuses[200] < 40 || statuses[200] > 40+refill || statuses[200]+statuses[429] != 45 {
		t.Errorf("Envoy answered %v, want 40 200s (+ at most %d refilled), the rest 429s", statuses, refill)
		for _, k := range []string{"cluster.rls.upstream_cx_total", "cluster.rls.ssl.handshake", "cluster.rls.ssl.connection_error", "cluster.upstream.ratelimit.error"} {
			t.Logf("Envoy's %s: %d", k, e.Stat(k))
		}
	}
	if authorized != 45 {
		t.Errorf("limitd counted %v calls of %s, want 45", authorized, p.envoyCaller)
	}
}

// Attacks on the TLS door, at once, each a grpcattack process: 1,024
// connections sending a ClientHello a byte every 200 ms (the default cap
// of connections, all of it), and handshake floods with a certificate of
// another CA, an expired one and none. Every slow handshake is closed
// (evicted at the cap, or at the handshake deadline), no flooding
// handshake succeeds, limitd's RSS stays under doorMemoryBound, and a
// gateway with Envoy's certificate is answered throughout (its calls one
// after the other until every attacker has ended).
func TestGRPCDoorTLSAttacks(t *testing.T) {
	t.Parallel()
	p := newDoorPKI(t)
	l := startTLSLimitd(t, p, "--conn-grace", "100ms")
	pid := l.pid()
	g := newTLSGateway(t, l, p)
	if _, err := g.call(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	base, cpu0, start := procStatus(t, pid, "VmRSS"), cpuTime(t, pid), time.Now()
	slow := startAttack(t, l, "-mode", "slowhello", "-conns", "1024", "-for", "20s", "-tls")
	floods := map[string]*attacker{
		"another CA's certificate": startAttack(t, l, "-mode", "handshakes", "-conns", "4", "-for", "15s", "-tls", "-tls-cert", p.strangerCert, "-tls-key", p.strangerKey),
		"an expired certificate":   startAttack(t, l, "-mode", "handshakes", "-conns", "2", "-for", "15s", "-tls", "-tls-cert", p.expiredCert, "-tls-key", p.expiredKey),
		"no certificate":           startAttack(t, l, "-mode", "handshakes", "-conns", "2", "-for", "15s", "-tls"),
	}
	var (
		answered, failed int
		took             []time.Duration
		peak             = base
	)
	running := func() bool {
		all := []*attacker{slow}
		for _, a := range floods {
			all = append(all, a)
		}
		for _, a := range all {
			select {
			case err := <-a.done:
				a.done <- err
			default:
				return true
			}
		}
		return false
	}
	for running() {
		if d, err := g.call(5 * time.Second); err != nil {
			failed++
			t.Logf("gateway: %v", err)
		} else {
			answered++
			took = append(took, d)
		}
		peak = max(peak, procStatus(t, pid, "VmRSS"))
	}
	cpu, elapsed := cpuTime(t, pid)-cpu0, time.Since(start)
	r := slow.wait()
	t.Logf("slow ClientHellos: %d connections opened, %d refused, %d closed by limitd (the last after %.1f s), %d bytes of hello sent",
		r.Opened, r.Refused, r.Closed, r.ClosedAfter, r.HelloBytes)
	for name, a := range floods {
		f := a.wait()
		t.Logf("handshake flood, %s: %d handshakes failed, %d succeeded", name, f.HandshakeFailures, f.Handshakes)
		if f.Handshakes != 0 || f.HandshakeFailures == 0 {
			t.Errorf("handshake flood, %s: %d succeeded, %d failed; want none to succeed", name, f.Handshakes, f.HandshakeFailures)
		}
	}
	hwm := procStatus(t, pid, "VmHWM")
	t.Logf("limitd: RSS %d MiB before, peak %d MiB (VmHWM %d MiB); %v of CPU in %v; %v failed handshakes counted; gateway: %d answered, %d failed, p50 %v, p99 %v",
		base>>20, peak>>20, hwm>>20, cpu.Round(10*time.Millisecond), elapsed.Round(100*time.Millisecond),
		l.metric(t, "limitd_grpc_tls_handshake_failures_total"), answered, failed, quantile(took, 0.5), quantile(took, 0.99))
	if r.Closed != r.Opened {
		t.Errorf("%d of %d slow handshakes still open at the end of their part of the attack", r.Opened-r.Closed, r.Opened)
	}
	if hwm > doorMemoryBound {
		t.Errorf("limitd's peak RSS %d MiB, want under %d MiB", hwm>>20, doorMemoryBound>>20)
	}
	if failed > 0 || answered == 0 {
		t.Errorf("the gateway: %d calls answered, %d failed during the attacks", answered, failed)
	}
	if got := l.metric(t, "limitd_grpc_tls_handshake_failures_total"); got <= 0 {
		t.Errorf("limitd_grpc_tls_handshake_failures_total %v, want the floods' failures counted", got)
	}
	if after, _ := newTLSGateway(t, l, p).calls(10, 5*time.Second); after != 10 {
		t.Errorf("a new gateway connection after the attacks: %d of 10 answered", after)
	}
}

// A cleartext client of the TLS door (an Envoy whose cluster lacks the
// transport socket) is not served: its connection fails the handshake.
func TestGRPCDoorTLSRefusesCleartext(t *testing.T) {
	t.Parallel()
	p := newDoorPKI(t)
	l := startTLSLimitd(t, p)
	before := l.metric(t, "limitd_grpc_tls_handshake_failures_total")
	answered, _ := newGateway(t, l).calls(3, 3*time.Second)
	if answered != 0 {
		t.Errorf("a cleartext gateway got %d of 3 answered", answered)
	}
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(l.grpcPort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	b, _ := io.ReadAll(c)
	if len(b) >= 9 && b[3] == 4 { // an HTTP/2 SETTINGS frame (a TLS alert's fourth byte is 0)
		t.Errorf("the TLS door answered a cleartext preface with HTTP/2: %q", b)
	}
	if after := l.metric(t, "limitd_grpc_tls_handshake_failures_total"); after <= before {
		t.Errorf("failed handshakes %v after %v, want the cleartext clients counted", after, before)
	}
}

// Envoy 1.40's rate limit quota filter streams its reports to limitd's
// quota service over mutual TLS (the cluster rlqs with Envoy's client
// certificate, no token): its first assignment arrives (a request of the
// key is admitted under DENY_ALL until then), and the stream is counted
// under the certificate's caller.
func TestRLQSMutualTLSEnvoy(t *testing.T) {
	t.Parallel()
	envoytest.Needs(t, false)
	p := newDoorPKI(t)
	l := startTLSLimitd(t, p)
	e := envoytest.Start(t, envoytest.Options{NoWasm: true, RLQSPort: l.grpcPort, RateLimitQuota: rlqsQuota("api_key", "x-api-key"),
		Concurrency: 2, Data: map[string]any{"rlqs_tls": map[string]any{"ca": p.ca, "cert": p.envoyCert, "key": p.envoyKey}}})
	f := newFleet(t, []*envoytest.Envoy{e}, "x-api-key", "k-tls")
	t.Logf("Envoy over mutual TLS admitted its first request after %v", f.untilAdmitted(0).Round(time.Millisecond))
	if got := l.metric(t, "limitd_rlqs_streams"); got != 1 {
		t.Errorf("limitd_rlqs_streams %v, want Envoy's one stream", got)
	}
	if got := l.metric(t, `limitd_rls_authorized_calls_total{caller="`+p.envoyCaller+`"}`); got < 1 {
		t.Errorf("calls of %s: %v, want the stream counted under the certificate's caller", p.envoyCaller, got)
	}
}

// TestGRPCDoorUnfinishedMessages over TLS (a server certificate, no client
// CA: the attacker completes its handshakes and has no token): the same
// bound, doorMemoryBound, with each connection's TLS buffers on top.
func TestGRPCDoorUnfinishedMessagesTLS(t *testing.T) {
	t.Parallel()
	testUnfinished(t, true, newDoorPKI(t))
}
