package service

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
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

// countingListener counts the connections it accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestConnGuardUnfinishedBodies: 40 clients without a token, each sending
// a request's headers and 10 bytes of a 1,000-byte body it never finishes
// (half to /v1/decide, half to /healthz), cannot keep a gateway out at a
// cap of 16: a /v1 request is answered 401 and its connection closed
// without its body being waited for, a /healthz one whose body is drained
// is evictable though active, and the gateway's connection is served.
func TestConnGuardUnfinishedBodies(t *testing.T) {
	s, _ := newTestServer(t, NewMemoryStore(MemoryOptions{}), "secret")
	g, err := NewConnGuard(ConnOptions{MaxConns: 16})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: raw}
	hs := &http.Server{Handler: s, ConnState: g.ConnState, ConnContext: g.ConnContext, IdleTimeout: time.Minute, ReadHeaderTimeout: time.Minute, ReadTimeout: time.Minute}
	go func() { _ = hs.Serve(g.Listener(ln)) }()
	t.Cleanup(func() { hs.Close() })
	addr := raw.Addr().String()

	const n = 40
	conns := make([]net.Conn, 0, n)
	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
		head := "POST /v1/decide HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
		if i%2 == 1 {
			head = "GET /healthz HTTP/1.1\r\nHost: x\r\n"
		}
		_, _ = io.WriteString(c, head+"Content-Length: 1000\r\n\r\n{\"buckets\"") // fails once closed at the cap
	}
	// Wait (bounded) until all 40 were accepted and the server has read
	// the request of every one still open.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		unread := 0
		for c := range g.conns {
			if c.idle {
				unread++
			}
		}
		g.mu.Unlock()
		if ln.n.Load() == n && unread == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: %d of %d connections accepted, %d requests unread", ln.n.Load(), n, unread)
		}
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/decide", strings.NewReader(okBody))
	req.Header.Set("Authorization", "Bearer secret")
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("the gateway's call after %d unfinished bodies failed after %v: %v", n, time.Since(start), err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the gateway's call: %d, want 200", resp.StatusCode)
	}
	// Every /v1 request still open was answered 401 and its connection
	// closed, its body never read.
	for i := 0; i < n; i += 2 {
		c := conns[i]
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			continue // closed at the cap or evicted
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
			t.Fatalf("unfinished /v1 request %d: %d (close %v), want 401 and the connection closed", i, resp.StatusCode, resp.Close)
		}
		if !waitClosed(c) {
			t.Fatalf("unfinished /v1 request %d: its connection stays open after the 401", i)
		}
	}
}

// guardClock is a ConnGuard's clock in tests: the time is set, never read
// from the machine.
type guardClock struct{ t time.Time }

func (c *guardClock) Now() time.Time { return c.t }

// pipeConn is one end of an in-memory connection, for admit.
func pipeConn(t *testing.T) net.Conn {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a
}

// guardStep is one step of a ConnGuard timeline: at a moment, a new
// connection named name arrives (admit), or conn's request is marked, or
// its state changes, or the guard is swept.
type guardStep struct {
	at    time.Duration // since t0
	op    string        // "admit", "request", "auth", "refuse", "active", "idle", "sweep"
	name  string
	want  string // admit: the connection evicted ("" none, "cap" the new one closed); sweep: those closed, sorted, comma-separated
	label string
}

// runGuard runs steps on a ConnGuard of opts whose clock they set.
func runGuard(t *testing.T, opts ConnOptions, steps []guardStep) {
	t.Helper()
	t0 := time.Unix(1000, 0)
	clk := &guardClock{t: t0}
	opts.Now = clk.Now
	g, err := NewConnGuard(opts)
	if err != nil {
		t.Fatal(err)
	}
	conns := map[string]*guardedConn{}
	open := func() map[*guardedConn]bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		m := map[*guardedConn]bool{}
		for c := range g.conns {
			m[c] = true
		}
		return m
	}
	gone := func(before map[*guardedConn]bool) string {
		after := open()
		var names []string
		for name, c := range conns {
			if before[c] && !after[c] {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		return strings.Join(names, ",")
	}
	for i, s := range steps {
		clk.t = t0.Add(s.at)
		before := open()
		got := ""
		switch s.op {
		case "admit":
			gc := g.admit(pipeConn(t))
			if gc == nil {
				got = "cap"
			} else {
				conns[s.name] = gc
				got = gone(before)
			}
		case "sweep":
			g.Sweep(clk.t)
			got = gone(before)
		case "request", "auth", "refuse":
			mark := map[string]ConnMark{"request": ConnRequest, "auth": ConnAuthenticated, "refuse": ConnRefused}[s.op]
			MarkRequest(g.ConnContext(context.Background(), conns[s.name]), mark)
		case "active":
			g.ConnState(conns[s.name], http.StateActive)
		case "idle":
			g.ConnState(conns[s.name], http.StateIdle)
		default:
			t.Fatalf("step %d: unknown op %q", i, s.op)
		}
		if got != s.want {
			t.Fatalf("step %d (%s): %s %s at t0+%v: got %q, want %q", i, s.label, s.op, s.name, s.at, got, s.want)
		}
	}
}

// TestConnGuardGrace: a fresh connection is not evicted until its grace
// is over or a request was read from it; past its grace, one that sent
// nothing is evicted (and swept) as idle since it was accepted.
func TestConnGuardGrace(t *testing.T) {
	const ms = time.Millisecond
	runGuard(t, ConnOptions{MaxConns: 2, Grace: time.Second, UnauthenticatedIdle: 5 * time.Second}, []guardStep{
		{0, "admit", "a", "", "below the cap"},
		{100 * ms, "admit", "b", "", "at the cap now"},
		{999 * ms, "admit", "c", "cap", "a and b in their grace: the new one is closed"},
		{999 * ms, "active", "b", "", "b's request is being read"},
		{999 * ms, "request", "b", "", "b's request reached the server, unauthenticated"},
		{999 * ms, "admit", "d", "b", "b's grace ended with its request: evicted, though active"},
		{1000 * ms, "admit", "e", "a", "a past its grace, idle since accepted"},
		{1500 * ms, "admit", "f", "cap", "d (accepted at 999 ms) and e in their grace"},
		{1999 * ms, "admit", "g", "d", "d past its grace"},
		{6000 * ms, "sweep", "", "e", "e idle since accepted (1 s) for 5 s; g only since 1999 ms"},
		{6999 * ms, "sweep", "", "g", "g idle for 5 s"},
	})
}

// TestConnGuardEvictionOrder: at the cap, a refused connection goes first,
// then the unauthenticated one idle longest, then the unauthenticated one
// whose request started first (a body that never ends); an authenticated
// one never, whatever its state, nor one in its grace.
func TestConnGuardEvictionOrder(t *testing.T) {
	const s = time.Second
	runGuard(t, ConnOptions{MaxConns: 5, Grace: 10 * s, UnauthenticatedIdle: time.Minute}, []guardStep{
		{0, "admit", "gw", "", ""},
		{0, "active", "gw", "", ""},
		{0, "auth", "gw", "", "a gateway authenticated, its call in flight"},
		{0, "admit", "gw2", "", ""},
		{0, "auth", "gw2", "", "another gateway"},
		{0, "idle", "gw2", "", "idle since 0"},
		{1 * s, "admit", "slow", "", ""},
		{1 * s, "active", "slow", "", ""},
		{1 * s, "request", "slow", "", "headers read at 1 s, its body never ends"},
		{2 * s, "admit", "hz", "", ""},
		{2 * s, "active", "hz", "", ""},
		{2 * s, "request", "hz", "", ""},
		{3 * s, "idle", "hz", "", "asked /healthz, idle since 3 s"},
		{3 * s, "admit", "bad", "", "at the cap now"},
		{3 * s, "active", "bad", "", ""},
		{4 * s, "refuse", "bad", "", "answered 401 at 4 s, closing"},
		{5 * s, "admit", "n1", "bad", "the refused one first"},
		{7 * s, "admit", "n2", "hz", "then the idle one, though slow's request is older; n1 in its grace"},
		{8 * s, "active", "n2", "", ""},
		{8 * s, "request", "n2", "", "n2's request is being read since 8 s"},
		{9 * s, "admit", "n3", "slow", "then the active one whose request started first"},
		{9500 * time.Millisecond, "admit", "n4", "n2", "n1 and n3 in their grace; n2 active since 8 s"},
		{9500 * time.Millisecond, "admit", "n5", "cap", "only gateways and fresh connections left"},
		{15 * s, "admit", "n6", "n1", "n1 past its grace: idle since accepted at 5 s"},
		{20 * s, "idle", "gw", "", "the gateway idle since 20 s"},
		{20 * s, "admit", "n7", "n3", "n3 past its grace, accepted before n4; never the gateways"},
		{200 * s, "sweep", "", "n4,n6,n7", "unauthenticated and idle for a minute; the gateways stay"},
	})
}

// h2cClient is an HTTP client speaking HTTP/2 over cleartext only (prior
// knowledge), on connections of its own.
func h2cClient(t *testing.T) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: 10 * time.Second, Transport: tr}
}

// guardConns returns, in one look, how many connections g holds and how
// many of them are idle, authenticated and refused.
func guardConns(g *ConnGuard) (open, idle, authed, refused int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for c := range g.conns {
		open++
		if c.idle {
			idle++
		}
		if c.authed {
			authed++
		}
		if !c.refused.IsZero() {
			refused++
		}
	}
	return
}

// waitGuard waits, at most 10 s, until cond holds of g's connections.
func waitGuard(t *testing.T, g *ConnGuard, what string, cond func(open, idle, authed, refused int) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		o, i, a, r := guardConns(g)
		if cond(o, i, a, r) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, not %s: %d open, %d idle, %d authenticated, %d refused", what, o, i, a, r)
		}
	}
}

// TestConnGuardH2C: over HTTP/2 (h2c, as NewHTTPServer serves it) the
// guard sees a connection active while a stream is open and idle when none
// is, and marks it authenticated by its first authorized stream; a
// connection without a token whose stream never finishes its body is
// answered 401 at once and closed.
func TestConnGuardH2C(t *testing.T) {
	s, _ := newTestServer(t, NewMemoryStore(MemoryOptions{}), "secret")
	g, err := NewConnGuard(ConnOptions{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewHTTPServer(s, g, nil)
	go func() { _ = hs.Serve(g.Listener(ln)) }()
	t.Cleanup(func() { hs.Close() })
	url := "http://" + ln.Addr().String() + "/v1/decide"

	// A gateway's stream whose body is still coming: active, authenticated.
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", url, pr)
	req.Header.Set("Authorization", "Bearer secret")
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	gw := h2cClient(t)
	go func() {
		resp, err := gw.Do(req)
		done <- result{resp, err}
	}()
	if _, err := io.WriteString(pw, okBody[:10]); err != nil {
		t.Fatal(err)
	}
	waitGuard(t, g, "one active authenticated connection", func(o, i, a, r int) bool { return o == 1 && i == 0 && a == 1 })
	_, _ = io.WriteString(pw, okBody[10:])
	pw.Close()
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	res.resp.Body.Close()
	if res.resp.StatusCode != 200 || res.resp.ProtoMajor != 2 {
		t.Fatalf("gateway: %d over %s, want 200 over HTTP/2", res.resp.StatusCode, res.resp.Proto)
	}
	waitGuard(t, g, "the gateway's connection idle", func(o, i, a, r int) bool { return o == 1 && i == 1 && a == 1 })

	// A client without a token, its body never finished: 401 at once,
	// then its connection goes (GOAWAY); the gateway's stays.
	pr2, pw2 := io.Pipe()
	t.Cleanup(func() { pw2.Close() })
	req2, _ := http.NewRequest("POST", url, pr2)
	req2.ContentLength = 1000
	go func() { _, _ = io.WriteString(pw2, okBody[:10]) }()
	resp, err := h2cClient(t).Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unfinished body without a token: %d, want 401", resp.StatusCode)
	}
	waitGuard(t, g, "the refused connection closed", func(o, i, a, r int) bool { return o == 1 && a == 1 })
	resp, err = gw.Post(url, "application/json", strings.NewReader(okBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token on the gateway's connection: %d, want 401", resp.StatusCode)
	}
	waitGuard(t, g, "the gateway's connection kept", func(o, i, a, r int) bool { return o == 1 && a == 1 && r == 0 })
}
