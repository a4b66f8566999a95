package grpcdoor

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-wasm/tokenbucket/service"
)

var epoch = time.Date(2026, 11, 29, 7, 0, 0, 0, time.UTC)

// clock is a fake clock, moved by the test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// echoMethod answers the caller the door put in the call's context.
const echoMethod = "/test.Echo/Caller"

var echoDesc = grpc.ServiceDesc{
	ServiceName: "test.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		echoMethodDesc("Caller", func(ctx context.Context) string { c, _ := service.CallerFrom(ctx); return c }),
		echoMethodDesc("Goroutine", func(context.Context) string { // the id of the goroutine serving the call
			buf := make([]byte, 64)
			id, _, _ := bytes.Cut(bytes.TrimPrefix(buf[:runtime.Stack(buf, false)], []byte("goroutine ")), []byte(" "))
			return string(id)
		}),
	},
}

// echoMethodDesc is the echo service's method name, answering what answer
// returns for the call's context, through the door's interceptor.
func echoMethodDesc(name string, answer func(context.Context) string) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
		req := new(wrapperspb.StringValue)
		if err := dec(req); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, _ any) (any, error) { return wrapperspb.String(answer(ctx)), nil }
		if in == nil {
			return h(ctx, req)
		}
		return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Echo/" + name}, h)
	}}
}

// door is a Host serving the echo service on a loopback port.
type door struct {
	t     *testing.T
	h     *Host
	clock *clock
	addr  string
	reg   *prometheus.Registry
}

// The callers of every test that needs some: a gateway's token, a front
// proxy's, and one identity the proxy forwards.
var (
	testTokens     = []service.Token{{Name: "gw", Value: "gw-secret"}, {Name: "proxy", Value: "proxy-secret", FrontProxy: true}}
	testIdentities = []service.Identity{{Name: "team-a", Value: "spiffe://a"}}
)

const testHeader = "X-Client-Identity"

func startDoor(t *testing.T, opts Options) *door {
	t.Helper()
	d := &door{t: t, clock: &clock{t: epoch}, reg: prometheus.NewRegistry()}
	opts.Now, opts.Registerer = d.clock.Now, d.reg
	h, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	d.h = h
	h.Server().RegisterService(&echoDesc, struct{}{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d.addr = ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- h.Serve(ln) }()
	t.Cleanup(func() {
		h.Stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return d
}

func (d *door) client() *grpc.ClientConn {
	d.t.Helper()
	cc, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { cc.Close() })
	return cc
}

// echo calls the echo service with md and returns the caller it answers.
func echo(cc *grpc.ClientConn, md ...string) (string, error) {
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), md...), 20*time.Second)
	defer cancel()
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, echoMethod, wrapperspb.String("hi"), out)
	return out.GetValue(), err
}

// waitCounter waits, at most 10 s, for the counter name to reach want, for
// a count the door makes after its client has seen the outcome (a refused
// TLS handshake: the alert goes out before the handshake returns), and
// returns its value.
func (d *door) waitCounter(name string, want float64) float64 {
	d.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if got := d.counter(name); got >= want || time.Now().After(deadline) {
			return got
		}
	}
}

func (d *door) counter(name string) float64 {
	d.t.Helper()
	mfs, err := d.reg.Gather()
	if err != nil {
		d.t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// Every call is authenticated from its metadata, once, by the same rules as
// the HTTP door's: a gateway's token names its caller; a front proxy's
// token needs the identity it forwards (the identity header, lower-cased),
// exactly one value and one in the file, and the call is that identity's.
func TestCallers(t *testing.T) {
	d := startDoor(t, Options{Tokens: testTokens, Identities: testIdentities, IdentityHeader: testHeader})
	cc := d.client()
	for _, c := range []struct {
		name string
		md   []string
		want string // "": refused Unauthenticated
	}{
		{"no token", nil, ""},
		{"wrong token", []string{"authorization", "Bearer nope"}, ""},
		{"two tokens", []string{"authorization", "Bearer gw-secret", "authorization", "Bearer gw-secret"}, ""},
		{"gateway", []string{"authorization", "Bearer gw-secret"}, "gw"},
		{"gateway, an identity ignored", []string{"authorization", "bearer gw-secret", "x-client-identity", "spiffe://a"}, "gw"},
		{"front proxy without identity", []string{"authorization", "Bearer proxy-secret"}, ""},
		{"front proxy, identity not in the file", []string{"authorization", "Bearer proxy-secret", "x-client-identity", "spiffe://gone"}, ""},
		{"front proxy, two identities", []string{"authorization", "Bearer proxy-secret", "x-client-identity", "spiffe://a", "x-client-identity", "spiffe://a"}, ""},
		{"front proxy, identity in the file", []string{"authorization", "Bearer proxy-secret", "x-client-identity", "spiffe://a"}, "team-a"},
		{"an identity without a token", []string{"x-client-identity", "spiffe://a"}, ""},
	} {
		got, err := echo(cc, c.md...)
		switch {
		case c.want == "" && status.Code(err) != codes.Unauthenticated:
			t.Errorf("%s: %q %v, want Unauthenticated", c.name, got, err)
		case c.want != "" && (err != nil || got != c.want):
			t.Errorf("%s: %q %v, want the caller %q", c.name, got, err, c.want)
		}
	}
	if got := d.counter("limitd_rls_unauthenticated_calls_total"); got != 7 {
		t.Errorf("unauthenticated calls %v, want 7", got)
	}
	if got := d.counter("limitd_rls_authorized_calls_total"); got != 3 {
		t.Errorf("authorized calls %v, want 3", got)
	}
}

// Without tokens (a loopback door) every call is service.DefaultCaller's.
func TestOpenDoor(t *testing.T) {
	d := startDoor(t, Options{})
	if got, err := echo(d.client()); err != nil || got != service.DefaultCaller {
		t.Fatalf("%q %v, want %q", got, err, service.DefaultCaller)
	}
}

// Health Check stays open; Watch and List, which a client can hold or make
// answer at length, need a token.
func TestHealthNeedsTokenButCheck(t *testing.T) {
	d := startDoor(t, Options{Tokens: testTokens, Identities: testIdentities, IdentityHeader: testHeader})
	d.h.SetServing(true)
	hc := healthpb.NewHealthClient(d.client())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: echoDesc.ServiceName}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Check without a token: %v %v, want SERVING", r, err)
	}
	if _, err := hc.List(ctx, &healthpb.HealthListRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("List without a token: %v, want Unauthenticated", err)
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("Watch without a token: %v, want Unauthenticated", err)
	}
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer gw-secret")
	if _, err := hc.List(authed, &healthpb.HealthListRequest{}); err != nil {
		t.Errorf("List with a token: %v", err)
	}
	if w, err = hc.Watch(authed, &healthpb.HealthCheckRequest{}); err == nil {
		var r *healthpb.HealthCheckResponse
		if r, err = w.Recv(); err == nil && r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Watch with a token: %v", r)
		}
	}
	if err != nil {
		t.Errorf("Watch with a token: %v", err)
	}
}

// rawConn is a client speaking HTTP/2 frames itself, as an attacker does.
type rawConn struct {
	t    *testing.T
	c    net.Conn
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
	dec  *hpack.Decoder
	next uint32
}

// dialRaw connects and exchanges the preface and settings; the server has
// then accepted (admitted) the connection.
func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	r, err := tryRaw(addr)
	if err != nil {
		t.Fatalf("raw connection: %v", err)
	}
	r.t = t
	t.Cleanup(func() { r.c.Close() })
	return r
}

func tryRaw(addr string) (*rawConn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	return rawOver(c)
}

// rawOver exchanges the preface and settings on c.
func rawOver(c net.Conn) (*rawConn, error) {
	r := &rawConn{c: c, fr: http2.NewFramer(c, c), next: 1}
	r.enc = hpack.NewEncoder(&r.hbuf)
	r.dec = hpack.NewDecoder(4096, nil)
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		c.Close()
		return nil, err
	}
	if err := r.fr.WriteSettings(); err != nil {
		c.Close()
		return nil, err
	}
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			c.Close()
			return nil, err
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			return r, r.fr.WriteSettingsAck()
		}
	}
}

// open sends the HEADERS of a call to method (with the token, unless
// empty) and returns its stream id.
func (r *rawConn) open(method, token string) uint32 {
	r.t.Helper()
	id, err := r.tryOpen(method, token)
	if err != nil {
		r.t.Fatalf("HEADERS: %v", err)
	}
	return id
}

func (r *rawConn) tryOpen(method, token string) (uint32, error) {
	r.hbuf.Reset()
	for _, hf := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "limitd"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = r.enc.WriteField(hpack.HeaderField{Name: hf[0], Value: hf[1]})
	}
	if token != "" {
		_ = r.enc.WriteField(hpack.HeaderField{Name: "authorization", Value: "Bearer " + token})
	}
	id := r.next
	r.next += 2
	return id, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hbuf.Bytes(), EndHeaders: true})
}

// status reads frames until stream id's grpc-status, and returns it.
func (r *rawConn) status(id uint32) string {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	defer r.c.SetReadDeadline(time.Time{})
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			r.t.Fatalf("reading stream %d's status: %v", id, err)
		}
		h, ok := f.(*http2.HeadersFrame)
		if !ok || h.StreamID != id {
			continue
		}
		fields, err := r.dec.DecodeFull(h.HeaderBlockFragment())
		if err != nil {
			r.t.Fatal(err)
		}
		for _, hf := range fields {
			if hf.Name == "grpc-status" {
				return hf.Value
			}
		}
	}
}

// closed reports whether the server closes the connection within the
// bound (reading and dropping what it sends until then).
func (r *rawConn) closed() bool {
	_ = r.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	defer r.c.SetReadDeadline(time.Time{})
	buf := make([]byte, 4096)
	for {
		_, err := r.c.Read(buf)
		if err == nil {
			continue
		}
		return !errors.Is(err, os.ErrDeadlineExceeded)
	}
}

// At the cap, a new connection evicts one that never carried an
// authenticated call once its grace is over (a preface-only one); when
// every other is authenticated or fresh, the new one is closed. The
// authenticated gateway is served throughout.
func TestGuardAtTheCap(t *testing.T) {
	d := startDoor(t, Options{Tokens: testTokens, Identities: testIdentities, IdentityHeader: testHeader, MaxConns: 2})
	gw := d.client()
	if _, err := echo(gw, "authorization", "Bearer gw-secret"); err != nil {
		t.Fatal(err)
	}
	idle := dialRaw(t, d.addr) // the preface only
	d.clock.add(2 * service.DefaultConnGrace)
	dialRaw(t, d.addr) // evicts idle
	if !idle.closed() {
		t.Fatal("the preface-only connection was not evicted for a new one")
	}
	if _, err := tryRaw(d.addr); err == nil {
		t.Fatal("a connection beyond the cap, with none evictable (one authenticated, one fresh), was served")
	}
	if got, err := echo(gw, "authorization", "Bearer gw-secret"); err != nil || got != "gw" {
		t.Fatalf("the gateway after the attack: %q %v", got, err)
	}
	if got := d.counter("limitd_grpc_connections_closed_total"); got != 2 {
		t.Errorf("connections closed %v, want 2 (one evicted, one at the cap)", got)
	}
}

// A connection that never authenticated is closed once idle for
// UnauthenticatedIdle, or busy with a stream for UnauthenticatedBusy, and
// one refused for its credentials at the next sweep; an authenticated one
// stays.
func TestSweep(t *testing.T) {
	d := startDoor(t, Options{Tokens: testTokens, Identities: testIdentities, IdentityHeader: testHeader,
		UnauthenticatedIdle: 5 * time.Second, UnauthenticatedBusy: 10 * time.Second})
	gw := d.client()
	if _, err := echo(gw, "authorization", "Bearer gw-secret"); err != nil {
		t.Fatal(err)
	}
	idle := dialRaw(t, d.addr)
	busy := dialRaw(t, d.addr)
	busy.open(healthCheck, "") // a Check whose message never comes
	refused := dialRaw(t, d.addr)
	if got := refused.status(refused.open(echoMethod, "nope")); got != "16" {
		t.Fatalf("a wrong token: grpc-status %s, want 16", got)
	}
	d.h.Sweep(d.clock.Now())
	if !refused.closed() {
		t.Error("the refused connection stays open after a sweep")
	}
	d.clock.add(6 * time.Second)
	d.h.Sweep(d.clock.Now())
	if !idle.closed() {
		t.Error("the idle anonymous connection stays open past UnauthenticatedIdle")
	}
	d.clock.add(5 * time.Second)
	d.h.Sweep(d.clock.Now())
	if !busy.closed() {
		t.Error("the busy anonymous connection stays open past UnauthenticatedBusy")
	}
	d.clock.add(time.Hour)
	d.h.Sweep(d.clock.Now())
	if got, err := echo(gw, "authorization", "Bearer gw-secret"); err != nil || got != "gw" {
		t.Fatalf("the gateway after the sweeps: %q %v", got, err)
	}
	if d.h.Conns() != 1 {
		t.Errorf("%d connections open, want the gateway's", d.h.Conns())
	}
}

// A connection that never authenticated has at most
// MaxUnauthenticatedStreams open (a health Check), whatever the methods it
// asks; once it carries an authenticated call, its Checks are not bounded.
func TestAnonymousStreams(t *testing.T) {
	d := startDoor(t, Options{Tokens: testTokens, Identities: testIdentities, IdentityHeader: testHeader})
	r := dialRaw(t, d.addr)
	first := r.open(healthCheck, "")
	if err := r.fr.WriteData(first, false, []byte{0, 0, 0, 1, 0, 1, 2}); err != nil { // 7 of a 256-byte message
		t.Fatal(err)
	}
	if got := r.status(r.open(healthCheck, "")); got != "8" {
		t.Errorf("a second Check beside an unfinished one: grpc-status %s, want 8 (ResourceExhausted)", got)
	}
	if got := r.status(r.open("/grpc.health.v1.Health/Watch", "")); got != "16" {
		t.Errorf("Watch without a token: grpc-status %s, want 16 (Unauthenticated)", got)
	}
	a := dialRaw(t, d.addr)
	a.open(healthCheck, "gw-secret")
	second := a.open(healthCheck, "")
	if err := a.fr.WriteData(second, true, []byte{0, 0, 0, 0, 0}); err != nil { // an empty request
		t.Fatal(err)
	}
	if got := a.status(second); got != "0" {
		t.Errorf("an authenticated connection's second Check: grpc-status %s, want 0", got)
	}
}

// A connection whose client resets streams faster than its budget (here a
// burst of 20, the clock standing still) is closed; one within it is not.
func TestRapidResetCloses(t *testing.T) {
	d := startDoor(t, Options{Tokens: testTokens[:1], ResetBurst: 20})
	calm := dialRaw(t, d.addr)
	for range 10 {
		_ = calm.fr.WriteRSTStream(calm.open(echoMethod, "gw-secret"), http2.ErrCodeCancel)
	}
	r := dialRaw(t, d.addr)
	for i := range 1000 {
		id, err := r.tryOpen(echoMethod, "gw-secret")
		if err == nil {
			err = r.fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
		if err != nil {
			t.Logf("closed after %d resets: %v", i+1, err)
			break
		}
	}
	if !r.closed() {
		t.Fatal("the connection resetting streams stays open")
	}
	if got := d.counter("limitd_grpc_reset_closed_total"); got != 1 {
		t.Errorf("closed for resets %v, want 1", got)
	}
	check := calm.open(healthCheck, "")
	_ = calm.fr.WriteData(check, true, []byte{0, 0, 0, 0, 0})
	if got := calm.status(check); got != "0" {
		t.Errorf("the connection within its budget: Check grpc-status %s, want 0", got)
	}
}

// TestCallsServedByWorkers: calls one after another are served on the
// door's StreamWorkers goroutines, whose stacks have grown already, not on
// a fresh goroutine each (which grows its stack on every call).
func TestCallsServedByWorkers(t *testing.T) {
	d := startDoor(t, Options{})
	cc := d.client()
	const calls = 4 * StreamWorkers
	ids := map[string]bool{}
	for range calls {
		out := new(wrapperspb.StringValue)
		if err := cc.Invoke(t.Context(), "/test.Echo/Goroutine", wrapperspb.String(""), out); err != nil {
			t.Fatal(err)
		}
		ids[out.GetValue()] = true
	}
	if len(ids) > StreamWorkers {
		t.Fatalf("%d calls were served on %d goroutines, want at most the %d workers", calls, len(ids), StreamWorkers)
	}
}
