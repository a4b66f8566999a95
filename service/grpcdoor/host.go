// Package grpcdoor is limitd's gRPC host: one listener, one connection
// guard and one authentication step under every gRPC service limitd serves
// (Envoy's rate limit service, package rls, and its rate limit quota
// service, package rlqs, register on it), plus the standard health service.
//
// The model: a connection is anonymous until it carries an authenticated
// call, and an anonymous connection holds nothing for long.
//
//   - Authentication happens once per call, when its headers arrive, before
//     any byte of its message is read: the call's bearer token (and, for a
//     front proxy's token, the identity it forwards in the identity header,
//     lower-cased as gRPC metadata) names its caller through the same
//     service.Callers as the HTTP API's, and the caller is put in the call's
//     context (service.WithCaller, read back with service.CallerFrom). A
//     call refused is answered Unauthenticated and never reaches a handler;
//     the interceptors refuse any call that arrives without a caller.
//     grpc.health.v1.Health/Check needs no token; Watch and List do.
//     With TLS and a client CA (Options.TLS, TLSFiles), a verified client
//     certificate authenticates its connection from the handshake on and
//     names the caller of its calls that carry no token (CertCaller); a
//     token, when a call carries one, names the caller instead.
//   - TLS, when set, runs between the guard and everything else: the guard
//     counts a connection from its accept, handshake or not, and the
//     reset scanner reads the decrypted frames (tls.go).
//   - Connections go through a service.ConnGuard, the HTTP door's: at most
//     MaxConns open; at the cap, a new connection evicts one that never
//     carried an authenticated call (refused first, then idle longest, then
//     busy longest), never an authenticated one nor one in its Grace; an
//     anonymous connection is closed once idle UnauthenticatedIdle or busy
//     UnauthenticatedBusy, and one refused for its credentials within a
//     second.
//   - An anonymous connection has at most MaxUnauthenticatedStreams streams
//     open (health checks); every stream's unread bytes are bounded by its
//     HTTP/2 flow-control window (StreamWindowBytes, fixed: no window
//     growth), and a message by MaxRecvBytes. So an anonymous connection
//     holds at most about StreamWindowBytes + MaxRecvBytes of messages
//     besides its buffers, and MaxConns of them a bounded total
//     (docs/operating-limitd.md states and tests the figure).
//   - A connection whose client resets streams (RST_STREAM frames, counted
//     from the bytes read) or has calls refused faster than
//     ResetsPerSecond, beyond a burst of ResetBurst, is closed.
package grpcdoor

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/ratelimit-wasm/tokenbucket/service"
)

// Bounds of the gRPC door (Options' defaults, and fixed ones).
const (
	// DefaultMaxRecvBytes bounds one request message.
	DefaultMaxRecvBytes = 64 << 10
	// DefaultMaxStreams bounds the calls in flight on one connection.
	DefaultMaxStreams = 256
	// DefaultMaxConns bounds the connections open at once.
	DefaultMaxConns = 1024
	// StreamWorkers is how many goroutines the server keeps to serve calls
	// on. A call served on a fresh goroutine grows its stack on the way in
	// (to decode its message, and again to wait for the store), which was
	// limitd's largest cost in the runtime at saturation; a worker's stack
	// has grown already. Beyond this many calls at once, each further call
	// gets a goroutine of its own, as without workers; idle workers hold a
	// few KiB of stack each.
	StreamWorkers = 64
	// MaxHeaderBytes bounds a call's metadata.
	MaxHeaderBytes = 16 << 10
	// MaxUnauthenticatedStreams bounds the streams open at once on a
	// connection that never carried an authenticated call (health Checks).
	MaxUnauthenticatedStreams = 1
	// DefaultUnauthenticatedBusy is how long such a connection may keep a
	// stream open.
	DefaultUnauthenticatedBusy = 10 * time.Second
	// DefaultResetsPerSecond and DefaultResetBurst: a connection whose
	// streams are reset by its client, or refused, faster than that is
	// closed. An Envoy resets a stream when its call times out (the rate
	// limit filter's 20 ms by default), so a burst of a gateway's timeouts
	// (a Redis stall) must fit: 1,000 at once, 200 a second sustained.
	DefaultResetsPerSecond = 200
	DefaultResetBurst      = 1000
	// StreamWindowBytes is each stream's HTTP/2 flow-control window: what a
	// client may send ahead of a handler's reads. ConnWindowBytes is the
	// connection's. Both are fixed (no window growth).
	StreamWindowBytes = 64 << 10
	ConnWindowBytes   = 1 << 20
	// BufferBytes sizes each connection's read and write buffers.
	BufferBytes = 16 << 10
	// KeepaliveMinTime is the least interval between a client's keepalive
	// pings; a client that pings faster is disconnected.
	KeepaliveMinTime = 10 * time.Second
	// MaxConnectionIdle closes a connection, authenticated or not, with no
	// call for that long.
	MaxConnectionIdle = 5 * time.Minute
	// HandshakeTimeout bounds a connection's set-up (its HTTP/2 preface
	// and settings).
	HandshakeTimeout = 5 * time.Second
)

// healthCheck is the one method served without a token.
const healthCheck = "/grpc.health.v1.Health/Check"

// Options configure a Host. Zero fields mean the defaults.
type Options struct {
	// Tokens, Identities and IdentityHeader are the callers
	// (service.NewCallers); no token: every call is
	// service.DefaultCaller's.
	Tokens         []service.Token
	Identities     []service.Identity
	IdentityHeader string
	// MaxRecvBytes bounds one request message (DefaultMaxRecvBytes).
	MaxRecvBytes int
	// MaxStreams bounds the calls in flight per connection
	// (DefaultMaxStreams).
	MaxStreams uint32
	// MaxConns bounds the connections open at once (DefaultMaxConns).
	MaxConns int
	// ResetsPerSecond and ResetBurst bound a connection's stream resets
	// and refused calls (DefaultResetsPerSecond, DefaultResetBurst).
	ResetsPerSecond float64
	ResetBurst      int
	// UnauthenticatedIdle (service.DefaultUnauthenticatedIdle),
	// UnauthenticatedBusy (DefaultUnauthenticatedBusy) and Grace
	// (service.DefaultConnGrace) are the guard's (service.ConnOptions).
	UnauthenticatedIdle time.Duration
	UnauthenticatedBusy time.Duration
	Grace               time.Duration
	// Now is the clock of the guard and the reset budgets (time.Now).
	Now func() time.Time
	// Registerer, when set, receives the door's metrics.
	Registerer prometheus.Registerer
	// Codec, when set, is the codec of every call (the quota service's
	// rlqs.Codec, which reads the reports gRPC's proto codec refuses).
	Codec encoding.CodecV2
	// TLS, when set, serves TLS (and mutual TLS with its ClientCA) instead
	// of cleartext h2c: see TLSFiles.
	TLS *TLSFiles
	// Logger receives the door's events (TLS files read again or
	// refused); nil: slog.Default().
	Logger *slog.Logger
	// MaxConnectionAge, when set, ends a connection that old with a GOAWAY
	// (gRPC adds a jitter of ±10%), and MaxConnectionAgeGrace, when set,
	// closes it that much later (zero: no bound of either).
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// EvictOpen: with no tokens, a connection stays as evictable at
	// MaxConns as an anonymous one (idle longest, then busy longest)
	// after its calls, instead of counting as authenticated, so that no
	// caller holds a slot for good where everyone may call (limitd's
	// ratelimit mode). Its streams are not limited.
	EvictOpen bool
}

// Host is the gRPC door: register services on Server, then Serve. Its
// health service reports NOT_SERVING for the server ("") and every
// registered service until SetServing(true). A Host is safe for concurrent
// use.
type Host struct {
	srv     *grpc.Server
	health  *health.Server
	guard   *service.ConnGuard
	callers *service.Callers
	idKey   string // the identity header's metadata key
	now     func() time.Time
	rate    float64
	burst   float64

	evictOpen bool // Options.EvictOpen

	calls           []prometheus.Counter
	authorized      *prometheus.CounterVec
	unauthenticated prometheus.Counter
	resetClosed     prometheus.Counter
	handshakeFailed prometheus.Counter
	certs           *certStore // nil: cleartext

	mu      sync.Mutex
	serving bool
	stop    chan struct{} // closed by Stop and GracefulStop
	stopped bool
}

// New returns a Host for opts.
func New(opts Options) (*Host, error) {
	if opts.MaxRecvBytes <= 0 {
		opts.MaxRecvBytes = DefaultMaxRecvBytes
	}
	if opts.MaxStreams == 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.ResetsPerSecond <= 0 {
		opts.ResetsPerSecond = DefaultResetsPerSecond
	}
	if opts.ResetBurst <= 0 {
		opts.ResetBurst = DefaultResetBurst
	}
	if opts.UnauthenticatedBusy <= 0 {
		opts.UnauthenticatedBusy = DefaultUnauthenticatedBusy
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	callers, err := service.NewCallers(opts.Tokens, opts.Identities, opts.IdentityHeader)
	if err != nil {
		return nil, fmt.Errorf("grpcdoor: %w", err)
	}
	guard, err := service.NewConnGuard(service.ConnOptions{MaxConns: opts.MaxConns,
		UnauthenticatedIdle: opts.UnauthenticatedIdle, UnauthenticatedBusy: opts.UnauthenticatedBusy, Grace: opts.Grace,
		Now: opts.Now, MetricName: "limitd_grpc_connections_closed_total", Registerer: opts.Registerer})
	if err != nil {
		return nil, err
	}
	h := &Host{guard: guard, callers: callers, idKey: strings.ToLower(callers.IdentityHeader()), now: opts.Now, evictOpen: opts.EvictOpen,
		rate: opts.ResetsPerSecond, burst: float64(opts.ResetBurst), stop: make(chan struct{})}
	if opts.TLS != nil {
		if opts.Logger == nil {
			opts.Logger = slog.Default()
		}
		if h.certs, err = newCertStore(*opts.TLS, opts.Now(), opts.Logger); err != nil {
			return nil, err
		}
	}
	authorized := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "limitd_rls_authorized_calls_total",
		Help: "gRPC calls (rate limit and quota services) authorized, by caller (the token's name, the identity a front proxy forwarded, or a verified client certificate's name)."}, []string{"caller"})
	h.unauthenticated = prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rls_unauthenticated_calls_total",
		Help: "gRPC calls refused Unauthenticated: no token, a wrong one, or a front proxy's without a known identity."})
	h.resetClosed = prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_grpc_reset_closed_total",
		Help: "gRPC connections closed for resetting streams, or having calls refused, faster than the door allows."})
	h.handshakeFailed = prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_grpc_tls_handshake_failures_total",
		Help: "gRPC connections closed because their TLS handshake failed: a client certificate refused, a protocol error, no handshake within the deadline, or the connection closed during it (evicted by the guard)."})
	h.authorized = authorized
	for _, name := range callers.Names() {
		h.calls = append(h.calls, authorized.WithLabelValues(name))
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{authorized, h.unauthenticated, h.resetClosed, h.handshakeFailed} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("grpcdoor: metrics: %w", err)
			}
		}
	}
	var extra []grpc.ServerOption
	if opts.Codec != nil {
		extra = append(extra, grpc.ForceServerCodecV2(opts.Codec))
	}
	h.srv = grpc.NewServer(append(extra,
		grpc.Creds(doorCreds{h}),
		grpc.InTapHandle(h.tap),
		grpc.MaxRecvMsgSize(opts.MaxRecvBytes),
		grpc.MaxConcurrentStreams(opts.MaxStreams),
		grpc.MaxHeaderListSize(MaxHeaderBytes),
		grpc.InitialWindowSize(StreamWindowBytes),
		grpc.InitialConnWindowSize(ConnWindowBytes),
		grpc.ReadBufferSize(BufferBytes),
		grpc.WriteBufferSize(BufferBytes),
		grpc.SharedWriteBuffer(true),
		grpc.ConnectionTimeout(HandshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: MaxConnectionIdle,
			MaxConnectionAge: opts.MaxConnectionAge, MaxConnectionAgeGrace: opts.MaxConnectionAgeGrace}),
		grpc.UnaryInterceptor(unary),
		grpc.StreamInterceptor(stream),
		grpc.NumStreamWorkers(StreamWorkers),
	)...)
	h.health = health.NewServer()
	h.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(h.srv, h.health)
	return h, nil
}

// Server is the gRPC server to register services on, before Serve.
func (h *Host) Server() *grpc.Server { return h.srv }

// SetServing sets the health of the server ("") and of every registered
// service.
func (h *Host) SetServing(ok bool) {
	h.mu.Lock()
	h.serving = ok
	h.mu.Unlock()
	h.applyHealth(ok)
}

func (h *Host) applyHealth(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	h.health.SetServingStatus("", st)
	for name := range h.srv.GetServiceInfo() {
		if name != healthpb.Health_ServiceDesc.ServiceName {
			h.health.SetServingStatus(name, st)
		}
	}
}

// CheckStore pings the store once and sets the health from the answer.
func (h *Host) CheckStore(ctx context.Context, st service.Store, timeout time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := st.Ping(pctx)
	if ctx.Err() == nil {
		h.SetServing(err == nil)
	}
	return err
}

// WatchStore runs CheckStore every period until ctx ends.
func (h *Host) WatchStore(ctx context.Context, st service.Store, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		_ = h.CheckStore(ctx, st, period)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Serve serves ln through the guard until Stop, sweeping the guard every
// second (on the real clock; Sweep is there for tests' clocks).
func (h *Host) Serve(ln net.Listener) error {
	h.mu.Lock()
	ok := h.serving
	h.mu.Unlock()
	h.applyHealth(ok) // services registered since New get their status
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
				h.guard.Sweep(h.now())
			}
		}
	}()
	err := h.srv.Serve(h.guard.Listener(ln))
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Sweep closes the anonymous connections idle or busy too long and the
// refused ones (service.ConnGuard.Sweep) at now; Serve calls it every
// second.
func (h *Host) Sweep(now time.Time) int { return h.guard.Sweep(now) }

// Conns returns the connections open.
func (h *Host) Conns() int { return h.guard.Len() }

func (h *Host) halt() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.stopped {
		h.stopped = true
		close(h.stop)
	}
}

// GracefulStop stops accepting, lets the calls in flight finish, and
// returns; after ctx ends it stops them too.
func (h *Host) GracefulStop(ctx context.Context) {
	h.halt()
	h.health.Shutdown()
	done := make(chan struct{})
	go func() { h.srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		h.srv.Stop()
		<-done
	}
}

// Stop closes every connection and call at once.
func (h *Host) Stop() {
	h.halt()
	h.srv.Stop()
}

// tap authenticates a call from its headers, before its message is read:
// it returns the stream's context with the caller, or the status that
// refuses it. grpc-go calls it on the connection's reading goroutine, with
// the transport's lock held: it takes only the connection's and the
// guard's locks.
func (h *Host) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	c := connOf(ctx)
	if c == nil {
		return nil, status.Error(codes.Internal, "grpcdoor: a connection not accepted by the door")
	}
	caller, why := service.DefaultCaller, ""
	auths, hasAuth := info.Header["authorization"]
	switch {
	case c.certCaller != "" && (h.callers.Open() || !hasAuth):
		caller = c.certCaller // a verified client certificate's, without a token
		c.certCalls.Inc()
	case !h.callers.Open():
		var identity []string
		if h.idKey != "" {
			identity = info.Header[h.idKey]
		}
		var auth string
		if len(auths) == 1 {
			auth = auths[0]
		}
		var i int
		if i, why = h.callers.Authenticate(auth, identity); i >= 0 {
			caller = h.callers.Names()[i]
			h.calls[i].Inc()
		}
	}
	if why == "" {
		mark := service.ConnAuthenticated
		if h.evictOpen && h.callers.Open() {
			mark = service.ConnRequest
		}
		h.guard.Mark(c.guarded, mark)
		c.opened(ctx, false)
		return service.WithCaller(ctx, caller), nil
	}
	authed := h.guard.Mark(c.guarded, service.ConnRequest)
	if info.FullMethodName == healthCheck {
		if !c.opened(ctx, !authed) {
			return nil, c.refuse(codes.ResourceExhausted, fmt.Sprintf("grpcdoor: at most %d call at once on a connection without a token", MaxUnauthenticatedStreams))
		}
		return ctx, nil
	}
	h.unauthenticated.Inc()
	if !authed {
		h.guard.Mark(c.guarded, service.ConnRefused)
	}
	return nil, c.refuse(codes.Unauthenticated, "grpcdoor: "+why)
}

// unary and stream refuse a call without a caller (the tap sets it) but
// the open health Check: the one gate every service's calls pass.
func unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if _, ok := service.CallerFrom(ctx); !ok && info.FullMethod != healthCheck {
		return nil, status.Error(codes.Unauthenticated, "grpcdoor: authorization: no caller")
	}
	return handler(ctx, req)
}

func stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if _, ok := service.CallerFrom(ss.Context()); !ok {
		return status.Error(codes.Unauthenticated, "grpcdoor: authorization: no caller")
	}
	return handler(srv, ss)
}

// errResets ends a connection closed for its resets.
var errResets = errors.New("grpcdoor: connection closed: streams reset or refused too fast")

// conn is a connection the door serves, over the guard's.
type conn struct {
	net.Conn          // what HTTP/2 is read from: the guard's, or TLS over it
	guarded  net.Conn // the guard's
	h        *Host
	scan     frameScanner // the reading goroutine's

	// certCaller is the caller a verified client certificate names, ""
	// without one; certCalls counts its calls.
	certCaller string
	certCalls  prometheus.Counter

	mu     sync.Mutex
	budget resetBudget
	open   int // streams open
}

// Read implements net.Conn, following the frames read: past its reset
// budget, it closes the connection.
func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if r := c.scan.feed(p[:n]); r > 0 && !c.spend(r) {
			c.h.resetClosed.Inc()
			_ = c.guarded.Close()
			return 0, errResets
		}
	}
	return n, err
}

func (c *conn) spend(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.budget.spend(n, c.h.now())
}

// refuse spends a reset for a refused call (closing the connection past
// its budget) and returns the status refusing it.
func (c *conn) refuse(code codes.Code, msg string) error {
	if !c.spend(1) {
		c.h.resetClosed.Inc()
		_ = c.guarded.Close()
	}
	return status.Error(code, msg)
}

// opened counts a stream open until ctx (the stream's) ends, reporting the
// connection busy to the guard while one is; with anonymous set, only
// while fewer than MaxUnauthenticatedStreams are open (else false).
func (c *conn) opened(ctx context.Context, anonymous bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if anonymous && c.open >= MaxUnauthenticatedStreams {
		return false
	}
	if c.open++; c.open == 1 {
		c.h.guard.ConnState(c.guarded, http.StateActive)
	}
	context.AfterFunc(ctx, c.closed)
	return true
}

func (c *conn) closed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open--; c.open == 0 {
		c.h.guard.ConnState(c.guarded, http.StateIdle)
	}
}

// doorCreds are the door's transport credentials: cleartext (Envoy's
// clusters speak h2c) or, with Options.TLS, TLS run over the guard's
// connection; either way they wrap each accepted connection in a conn and
// hand it to the tap through the call's peer.
type doorCreds struct{ h *Host }

type connInfo struct {
	credentials.CommonAuthInfo
	c   *conn
	tls bool
}

func (i connInfo) AuthType() string {
	if i.tls {
		return "tls"
	}
	return "insecure"
}

func connOf(ctx context.Context) *conn {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(connInfo)
	if !ok {
		return nil
	}
	return info.c
}

// ServerHandshake implements credentials.TransportCredentials. grpc-go
// calls it under the connection's HandshakeTimeout deadline.
func (d doorCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c := &conn{Conn: raw, guarded: raw, h: d.h, budget: resetBudget{rate: d.h.rate, burst: d.h.burst}}
	if d.h.certs == nil {
		return c, connInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, c: c}, nil
	}
	tc := tls.Server(raw, d.h.certs.config(d.h.now()))
	if err := tc.Handshake(); err != nil {
		d.h.handshakeFailed.Inc()
		_ = raw.Close()
		return nil, nil, fmt.Errorf("grpcdoor: tls handshake: %w", err)
	}
	c.Conn = tc
	if st := tc.ConnectionState(); len(st.VerifiedChains) > 0 {
		name, err := CertCaller(st.PeerCertificates[0]) // VerifyConnection checked it
		if err != nil {
			d.h.handshakeFailed.Inc()
			_ = raw.Close()
			return nil, nil, err
		}
		c.certCaller, c.certCalls = name, d.h.authorized.WithLabelValues(name)
		d.h.guard.Mark(raw, service.ConnAuthenticated)
	}
	return c, connInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, c: c, tls: true}, nil
}

func (doorCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("grpcdoor: server credentials only")
}

func (d doorCreds) Info() credentials.ProtocolInfo {
	if d.h.certs != nil {
		return credentials.ProtocolInfo{SecurityProtocol: "tls"}
	}
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (d doorCreds) Clone() credentials.TransportCredentials { return d }

// OverrideServerName is part of credentials.TransportCredentials.
func (doorCreds) OverrideServerName(string) error { return nil }
