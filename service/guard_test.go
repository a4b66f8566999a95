package service

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// gatherCounter reads the counter name (summed over its series) from reg.
func gatherCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		sum := 0.0
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
		return sum
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// pingCounter is a real store whose Pings are counted.
type pingCounter struct {
	Store
	pings atomic.Int64
}

func (p *pingCounter) Ping(ctx context.Context) error {
	p.pings.Add(1)
	return p.Store.Ping(ctx)
}

// TestReadyzCached: a flood of unauthenticated /readyz sends one store Ping
// per ReadyEvery, not one each.
func TestReadyzCached(t *testing.T) {
	_, _, rs := newMini(t, RedisOptions{})
	st := &pingCounter{Store: rs}
	now := time.Unix(1000, 0)
	s, err := NewServer(Config{Store: st, Registry: prometheus.NewRegistry(), Now: func() time.Time { return now },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if w := do(s, "GET", "/readyz", ""); w.Code != 200 {
			t.Fatalf("/readyz = %d %s", w.Code, w.Body)
		}
	}
	if n := st.pings.Load(); n != 1 {
		t.Fatalf("100 /readyz within a second sent %d PINGs, want 1", n)
	}
	now = now.Add(DefaultReadyEvery)
	do(s, "GET", "/readyz", "")
	if n := st.pings.Load(); n != 2 {
		t.Fatalf("after ReadyEvery: %d PINGs, want 2", n)
	}
}

// TestMetricsCountWhatWasApplied: returns and refunds the ledger refuses
// are not counted as returned or refunded tokens.
func TestMetricsCountWhatWasApplied(t *testing.T) {
	clk := &fakeClock{}
	clk.Set(t0)
	s, reg := newTestServer(t, NewMemoryStore(MemoryOptions{Now: clk.Now}), "")
	do(s, "POST", "/v1/decide", `{"buckets":[{"key":"k","tokens_per_second":1,"burst":5,"cost":5,"refundable":true}]}`)
	do(s, "POST", "/v1/lease", `{"buckets":[{"key":"k","tokens_per_second":1,"burst":5,"want":5,"min":0,"return":5}]}`)
	do(s, "POST", "/v1/charge", `{"buckets":[{"key":"k","tokens_per_second":1,"burst":5,"amount":-5}]}`)
	do(s, "POST", "/v1/charge", `{"buckets":[{"key":"k","tokens_per_second":1,"burst":5,"amount":-5}]}`)
	if got := gatherCounter(t, reg, "limitd_returned_tokens_total"); got != 0 {
		t.Errorf("returned = %v, want 0 (nothing was leased)", got)
	}
	if got := gatherCounter(t, reg, "limitd_refunded_tokens_total"); got != 5 {
		t.Errorf("refunded = %v, want 5 (the one reservation)", got)
	}
}

// serveGuarded serves s on loopback through a ConnGuard of opts.
func serveGuarded(t *testing.T, s *Server, opts ConnOptions) (*ConnGuard, string) {
	t.Helper()
	g, err := NewConnGuard(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s, ConnState: g.ConnState, ConnContext: g.ConnContext, IdleTimeout: time.Minute, ReadHeaderTimeout: time.Minute}
	go func() { _ = hs.Serve(g.Listener(ln)) }()
	t.Cleanup(func() { hs.Close() })
	return g, ln.Addr().String()
}

// rawGet sends one GET on conn (a POST without a body for a /v1 path) and
// reads the response.
func rawGet(t *testing.T, c net.Conn, r *bufio.Reader, path, auth string) int {
	t.Helper()
	req := "GET " + path + " HTTP/1.1\r\nHost: x\r\n"
	if strings.HasPrefix(path, "/v1/") {
		req = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
	}
	if auth != "" {
		req += "Authorization: Bearer " + auth + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// waitClosed reports whether the peer closed c (a read returns EOF or a
// reset) within a bound.
func waitClosed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !isTimeout(err)
}

// waitIdle waits, at most 5 s, until n connections that never
// authenticated are idle in g.
func waitIdle(t *testing.T, g *ConnGuard, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		idle := 0
		for c := range g.conns {
			if c.idle && !c.authed {
				idle++
			}
		}
		g.mu.Unlock()
		if idle >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d idle unauthenticated connections after 5 s, want %d", idle, n)
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestConnGuard: connections that only asked /healthz are swept once idle
// too long and are evicted for new ones at the cap; a connection that
// carried an authenticated call is neither; at the cap with no one to
// evict, a new connection is closed at once.
func TestConnGuard(t *testing.T) {
	s, _ := newTestServer(t, NewMemoryStore(MemoryOptions{}), "secret")
	g, addr := serveGuarded(t, s, ConnOptions{MaxConns: 3, UnauthenticatedIdle: 5 * time.Second})
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	authed, ar := dial()
	if code := rawGet(t, authed, ar, "/v1/decide", "secret"); code != http.StatusBadRequest {
		t.Fatalf("authenticated POST /v1/decide = %d, want 400 (authorized, no body)", code)
	}
	anon1, r1 := dial()
	if code := rawGet(t, anon1, r1, "/healthz", ""); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	anon2, r2 := dial()
	if code := rawGet(t, anon2, r2, "/healthz", ""); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	// At the cap: a fourth connection evicts the anonymous one idle longest.
	fourth, r4 := dial()
	if code := rawGet(t, fourth, r4, "/healthz", ""); code != 200 {
		t.Fatalf("/healthz on a fourth connection = %d, want 200", code)
	}
	// One of the two anonymous ones went (which one depends on when the
	// server marked each idle); the authenticated one stays.
	if g.Len() != 3 {
		t.Fatalf("%d connections open after the eviction, want 3", g.Len())
	}
	// The sweep closes the anonymous idle ones, not the authenticated one.
	// The server marks a connection idle after writing its answer, which
	// the client may read first: wait (bounded) until it has.
	waitIdle(t, g, 2)
	if n := g.Sweep(time.Now().Add(6 * time.Second)); n != 2 {
		t.Fatalf("Sweep closed %d connections, want 2 (the anonymous one left and the fourth)", n)
	}
	if !waitClosed(anon1) || !waitClosed(anon2) || !waitClosed(fourth) {
		t.Fatal("evicted or swept connections still open")
	}
	if code := rawGet(t, authed, ar, "/healthz", ""); code != 200 {
		t.Fatalf("the authenticated connection after the sweep: %d, want 200", code)
	}
	// Three authenticated connections: a fourth is closed at once.
	for range 2 {
		c, r := dial()
		if code := rawGet(t, c, r, "/v1/decide", "secret"); code != http.StatusBadRequest {
			t.Fatalf("authenticated = %d", code)
		}
	}
	over, ro := dial()
	if code := rawGet(t, over, ro, "/healthz", ""); code != 0 {
		t.Fatalf("a connection beyond the cap was served: %d", code)
	}
}

// TestServerTokenPerGateway: with one token per gateway, each is accepted
// and counted under its gateway's name; any other is refused; revoking one
// gateway's token is removing its line.
func TestServerTokenPerGateway(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := NewServer(Config{Store: NewMemoryStore(MemoryOptions{}), Registry: reg,
		Tokens: []Token{{Name: "gw-a", Value: "tok-a"}, {Name: "gw-b", Value: "tok-b"}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tok  string
		want int
	}{{"tok-a", 200}, {"tok-b", 200}, {"tok-b", 200}, {"tok-c", 401}, {"", 401}} {
		hdr := []string{}
		if tc.tok != "" {
			hdr = []string{"Authorization", "Bearer " + tc.tok}
		}
		if w := do(s, "POST", "/v1/decide", okBody, hdr...); w.Code != tc.want {
			t.Errorf("token %q: %d %s, want %d", tc.tok, w.Code, w.Body, tc.want)
		}
	}
	mfs, _ := reg.Gather()
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "limitd_authorized_calls_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "caller" {
						got[l.GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	if got["gw-a"] != 1 || got["gw-b"] != 2 {
		t.Errorf("limitd_authorized_calls_total = %v, want gw-a 1, gw-b 2", got)
	}
	if _, err := NewServer(Config{Store: NewMemoryStore(MemoryOptions{}), Tokens: []Token{{Name: "x", Value: "a"}, {Name: "x", Value: "b"}}}); err == nil {
		t.Error("two tokens named alike: want an error")
	}
}
