package rlsxds

import (
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// newClient is a client of s with mutual TLS, configuring tg.
func newClient(t *testing.T, s *adsServer, p *pki, tg *target, w *waits, log *logBuffer) *Client {
	t.Helper()
	tlsc, err := TLSConfig(p.clientCert, p.clientKey, p.caFile, "xds.test")
	if err != nil {
		t.Fatal(err)
	}
	md, _ := structpb.NewStruct(map[string]any{"cluster": "ratelimit"})
	o := Options{Server: s.addr, NodeID: "envoy-ratelimit", NodeMetadata: md, TLS: tlsc,
		Headers: map[string]string{"x-tenant": "t1"}, Apply: tg.srv.SetConfig, Loaded: tg.m.ConfigLoaded,
		Backoff: Backoff{Initial: 100 * time.Millisecond, Max: time.Second}, Rand: func() float64 { return 0.5 }}
	if w != nil {
		o.Wait = w.wait
	}
	o.Logger = quiet
	if log != nil {
		o.Logger = slogTo(log)
	}
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Over mutual TLS, the client names its node, gets the snapshot, applies
// it and ACKs its version and nonce; a snapshot that does not validate is
// NACKed with the reason (naming the resource as a file) and the previous
// configuration keeps serving; a good one after it applies, and a bucket
// whose limit did not change keeps its tokens.
func TestClientACKNACK(t *testing.T) {
	p := newPKI(t)
	s := startADS(t, "127.0.0.1:0", p.serverTLS())
	tg := newTarget(t)
	log := &logBuffer{}
	c := newClient(t, s, p, tg, nil, log)
	s.set("envoy-ratelimit", "1", domain("default/policy", "gw",
		limit("kept", "x", 5, rlsconf.RateLimitUnit_MINUTE),
		limit("changed", "x", 5, rlsconf.RateLimitUnit_MINUTE)))
	run(t, c)
	awaitConfigured(t, c)
	first := s.await("ACK of version 1", ack("1"))
	if first.GetNode().GetId() != "envoy-ratelimit" || first.GetTypeUrl() != TypeURL ||
		first.GetNode().GetMetadata().GetFields()["cluster"].GetStringValue() != "ratelimit" {
		t.Errorf("ACK: node %v, type %q", first.GetNode(), first.GetTypeUrl())
	}
	s.mu.Lock()
	if len(s.headers) != 1 || strings.Join(s.headers[0].Get("x-tenant"), ",") != "t1" {
		t.Errorf("stream headers %v, want x-tenant: t1", s.headers)
	}
	s.mu.Unlock()
	if tg.loads(t, "success") != 1 {
		t.Errorf("loads: %v", tg.loads(t, "success"))
	}
	for range 3 {
		if _, err := tg.call("gw", "kept", "x"); err != nil {
			t.Fatal(err)
		}
		if _, err := tg.call("gw", "changed", "x"); err != nil {
			t.Fatal(err)
		}
	}

	// A bad snapshot: a limit with no unit.
	s.set("envoy-ratelimit", "2", domain("default/bad", "gw",
		limit("kept", "x", 5, rlsconf.RateLimitUnit_UNKNOWN)))
	n := s.await("NACK", nack)
	if n.GetVersionInfo() != "1" || n.GetResponseNonce() == "" {
		t.Errorf("NACK: version %q (want the last ACKed, 1), nonce %q", n.GetVersionInfo(), n.GetResponseNonce())
	}
	want := "rlsconfig: xds:default/bad"
	if msg := n.GetErrorDetail().GetMessage(); !strings.Contains(msg, want) || !strings.Contains(msg, "invalid rate limit unit 'UNKNOWN'") ||
		n.GetErrorDetail().GetCode() != int32(codes.InvalidArgument) {
		t.Errorf("NACK: error_detail %v, want InvalidArgument naming %q and the unit", n.GetErrorDetail(), want)
	}
	if tg.loads(t, "error") != 1 {
		t.Errorf("refused loads: %v", tg.loads(t, "error"))
	}
	if !strings.Contains(log.String(), "NACK") {
		t.Errorf("no NACK in the log: %s", log)
	}
	r, err := tg.call("gw", "kept", "x")
	if err != nil || r.GetStatuses()[0].GetLimitRemaining() != 1 {
		t.Fatalf("after the NACK: %v, %v; want the old limit serving (1 left)", r, err)
	}

	// A good snapshot: kept keeps its bucket, changed starts anew.
	s.set("envoy-ratelimit", "3", domain("default/policy", "gw",
		limit("kept", "x", 5, rlsconf.RateLimitUnit_MINUTE),
		limit("changed", "x", 6, rlsconf.RateLimitUnit_MINUTE)))
	s.await("ACK of version 3", ack("3"))
	r, err = tg.call("gw", "kept", "x")
	if err != nil || r.GetOverallCode() != pb.RateLimitResponse_OK || r.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Errorf("kept: %v, %v; want 0 left (5 - 4 before - 1)", r, err)
	}
	r, err = tg.call("gw", "changed", "x")
	if err != nil || r.GetStatuses()[0].GetLimitRemaining() != 5 {
		t.Errorf("changed: %v, %v; want 5 left (a new bucket of 6)", r, err)
	}
	if c.Version() != "3" || tg.loads(t, "success") != 2 {
		t.Errorf("version %q, loads %v", c.Version(), tg.loads(t, "success"))
	}
}

// The server stopped, the client backs off (the delay doubling, jittered)
// and reconnects to the server started again on the same address, which
// serves a new snapshot; meanwhile the old configuration serves.
func TestClientReconnects(t *testing.T) {
	p := newPKI(t)
	s := startADS(t, "127.0.0.1:0", p.serverTLS())
	tg := newTarget(t)
	w := newWaits()
	c := newClient(t, s, p, tg, w, nil)
	s.set("envoy-ratelimit", "1", domain("a", "gw", limit("k", "v", 1, rlsconf.RateLimitUnit_HOUR)))
	run(t, c)
	awaitConfigured(t, c)
	s.await("ACK of version 1", ack("1"))

	s.grpc.Stop()
	// Backoff{100ms, 1s}, Rand 0.5: 75ms, then 150ms, 300ms, 600ms, 750ms.
	if d := w.next(t); d != 75*time.Millisecond {
		t.Errorf("first back-off %v, want 75ms (100ms, jittered to 3/4)", d)
	}
	w.release <- struct{}{}
	if d := w.next(t); d != 150*time.Millisecond {
		t.Errorf("second back-off %v, want 150ms", d)
	}
	if r, err := tg.call("gw", "k", "v"); err != nil || r.GetOverallCode() != pb.RateLimitResponse_OK {
		t.Errorf("while the server is down: %v, %v", r, err)
	}
	s2 := startADS(t, s.addr, p.serverTLS())
	s2.set("envoy-ratelimit", "2", domain("a", "gw", limit("k", "v", 9, rlsconf.RateLimitUnit_HOUR)))
	w.release <- struct{}{}
	for range 20 { // until the listener is back: bounded
		select {
		case <-w.asked:
			w.release <- struct{}{}
			continue
		case <-s2.got:
		}
		break
	}
	s2.await("ACK of version 2", ack("2"))
	r, err := tg.call("gw", "k", "v")
	if err != nil || r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 9 {
		t.Errorf("after reconnecting: %v, %v; want the new limit", r, err)
	}
}

// Before any snapshot the service answers Unavailable and Configured is
// open; the first snapshot closes it and the service answers.
func TestClientBeforeSnapshot(t *testing.T) {
	p := newPKI(t)
	s := startADS(t, "127.0.0.1:0", p.serverTLS())
	tg := newTarget(t)
	c := newClient(t, s, p, tg, nil, nil)
	run(t, c)
	s.await("the first request", func(r *discovery.DiscoveryRequest) bool { return r.GetResponseNonce() == "" })
	select {
	case <-c.Configured():
		t.Fatal("configured before any snapshot")
	default:
	}
	if _, err := tg.call("gw", "k", "v"); status.Code(err) != codes.Unavailable {
		t.Errorf("before any snapshot: %v, want Unavailable", err)
	}
	s.set("envoy-ratelimit", "1", domain("a", "gw", limit("k", "v", 1, rlsconf.RateLimitUnit_YEAR)))
	awaitConfigured(t, c)
	if r, err := tg.call("gw", "k", "v"); err != nil || r.GetOverallCode() != pb.RateLimitResponse_OK {
		t.Errorf("after the snapshot: %v, %v", r, err)
	}
}

// A client without the CA's certificate is refused by the server, and one
// trusting another CA refuses the server: both back off, configured by
// nothing.
func TestClientMutualTLSRefused(t *testing.T) {
	p := newPKI(t)
	s := startADS(t, "127.0.0.1:0", p.serverTLS())
	s.set("envoy-ratelimit", "1", domain("a", "gw", limit("k", "v", 1, rlsconf.RateLimitUnit_SECOND)))
	for name, files := range map[string][3]string{
		"no client certificate": {"", "", p.caFile},
		"another CA":            {p.clientCert, p.clientKey, p.other},
	} {
		t.Run(name, func(t *testing.T) {
			tg := newTarget(t)
			tlsc, err := TLSConfig(files[0], files[1], files[2], "xds.test")
			if err != nil {
				t.Fatal(err)
			}
			w := newWaits()
			c, err := New(Options{Server: s.addr, NodeID: "envoy-ratelimit", TLS: tlsc, Apply: tg.srv.SetConfig,
				Wait: w.wait, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			run(t, c)
			w.next(t)
			select {
			case <-c.Configured():
				t.Fatal("configured over a refused connection")
			default:
			}
		})
	}
}

func TestTLSConfig(t *testing.T) {
	p := newPKI(t)
	for _, c := range []struct {
		name               string
		cert, key, ca, san string
		wantNil            bool
		wantErr            string
	}{
		{name: "plaintext", wantNil: true},
		{name: "san alone", san: "x", wantErr: "server name without"},
		{name: "cert without key", cert: p.clientCert, wantErr: "needs its key"},
		{name: "ca not pem", ca: p.clientKey, wantErr: "no PEM certificate"},
		{name: "missing file", ca: "/nonexistent", wantErr: "no such file"},
		{name: "mutual", cert: p.clientCert, key: p.clientKey, ca: p.caFile, san: "xds.test"},
	} {
		got, err := TLSConfig(c.cert, c.key, c.ca, c.san)
		switch {
		case c.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: %v, want %q", c.name, err, c.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", c.name, err)
		case (got == nil) != c.wantNil:
			t.Errorf("%s: %v", c.name, got)
		}
	}
}

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 10 * time.Second}
	for i, want := range []time.Duration{time.Second, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second} {
		if i == 0 {
			continue
		}
		if got := b.Delay(i); got != want {
			t.Errorf("Delay(%d) = %v, want %v", i, got, want)
		}
	}
	if got := b.Delay(1 << 30); got != 10*time.Second {
		t.Errorf("Delay(2^30) = %v", got)
	}
}
