package service

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ConnOptions bound the connections a server keeps, so that callers that
// never authenticate (anyone who can reach the port may ask /healthz) cannot
// tie it up. Zero fields mean the defaults.
type ConnOptions struct {
	// MaxConns is the most connections open at once (default
	// DefaultMaxConns). Keep it below the process's open-file limit minus
	// its Redis connections.
	MaxConns int
	// UnauthenticatedIdle is how long a connection that has never carried
	// an authenticated /v1 request may stay idle (default
	// DefaultUnauthenticatedIdle). Authenticated connections keep the
	// HTTP server's own idle timeout.
	UnauthenticatedIdle time.Duration
	// Grace is how long a fresh connection that has not yet had a request
	// read is kept from eviction (default DefaultConnGrace): its request
	// may already be in the socket, waiting for the server to read it.
	Grace time.Duration
	// UnauthenticatedBusy, when set, is how long a connection that never
	// carried an authenticated call may stay busy (streams open without a
	// break) before Sweep closes it. Zero: no bound (the HTTP server's
	// ReadTimeout bounds a request instead); the gRPC door sets it.
	UnauthenticatedBusy time.Duration
	// Now is the guard's clock (default time.Now).
	Now func() time.Time
	// MetricName names the counter of closed connections (default
	// limitd_connections_closed_total), one per door on a registry.
	MetricName string
	// Registerer, when set, receives the counter of closed connections.
	Registerer prometheus.Registerer
}

// Defaults of ConnOptions.
//
// DefaultConnGrace is one second: far longer than a server, even a loaded
// one, takes to read a request that is already in the socket, so a
// gateway's fresh connection is not evicted before its request is read;
// and short, because a client that connects and sends nothing holds a slot
// that cannot be evicted for that long. A client opening connections
// faster than MaxConns per Grace (512 a second with the defaults) can keep
// new connections out while it lasts; the authenticated connections already
// open keep being served (gateways keep theirs open: HTTP/2 multiplexes
// every callout of a worker over one).
const (
	DefaultMaxConns            = 512
	DefaultUnauthenticatedIdle = 5 * time.Second
	DefaultConnGrace           = time.Second
)

// ConnGuard bounds an HTTP server's connections: at most MaxConns open,
// connections that never authenticated closed once idle for
// UnauthenticatedIdle, and a connection that was refused for its bearer
// token closed at once.
//
// A connection is evictable unless it carried an authenticated /v1 request
// (then never) or it is fresh: accepted less than Grace ago and no request
// read from it yet. Whether it is idle or in the middle of a request (a body
// that never ends) does not matter. A connection accepted at the cap evicts
// one evictable connection, chosen in this order:
//
//  1. one answered 401 and closing (its request refused, its body unread),
//     the one refused first;
//  2. one idle, the one idle longest (a fresh connection past its grace that
//     sent nothing counts as idle since accepted);
//  3. one in the middle of a request, the one whose request started first.
//
// When none is evictable the new connection is closed at once (the caller
// sees the connection reset), so the authenticated gateways are never
// pushed out by anonymous ones, nor a fresh one by a newer one.
//
// Wire it with Listener, and the http.Server's ConnState and ConnContext
// (NewHTTPServer does); Server marks each connection that carries a request
// (MarkRequest), authenticated or refused; call Sweep periodically (limitd
// does every second) with the current time. The gRPC door (package
// grpcdoor) wires the same guard without net/http: it reports a
// connection's streams through ConnState (StateActive while one is open,
// StateIdle when none is) and marks it with Mark. A ConnGuard is safe for
// concurrent use.
type ConnGuard struct {
	max    int
	idle   time.Duration
	busy   time.Duration
	grace  time.Duration
	now    func() time.Time
	closed *prometheus.CounterVec

	mu    sync.Mutex
	conns map[*guardedConn]struct{}
}

// NewConnGuard returns a ConnGuard for opts.
func NewConnGuard(opts ConnOptions) (*ConnGuard, error) {
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.UnauthenticatedIdle <= 0 {
		opts.UnauthenticatedIdle = DefaultUnauthenticatedIdle
	}
	if opts.Grace <= 0 {
		opts.Grace = DefaultConnGrace
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MetricName == "" {
		opts.MetricName = "limitd_connections_closed_total"
	}
	g := &ConnGuard{
		max:   opts.MaxConns,
		idle:  opts.UnauthenticatedIdle,
		busy:  opts.UnauthenticatedBusy,
		grace: opts.Grace,
		now:   opts.Now,
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: opts.MetricName,
			Help: "Connections closed by the connection guard: reason cap (a new connection at the cap, none to evict), evicted (an unauthenticated one, for a new one), idle (unauthenticated, idle too long), busy (unauthenticated, busy too long; gRPC only) or refused (its call refused for its credentials).",
		}, []string{"reason"}),
		conns: make(map[*guardedConn]struct{}),
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(g.closed); err != nil {
			return nil, fmt.Errorf("service: connections: metrics: %w", err)
		}
	}
	for _, reason := range closeReasons { // shown at 0 from the start
		g.closed.WithLabelValues(reason)
	}
	if g.busy > 0 {
		g.closed.WithLabelValues("busy")
	}
	return g, nil
}

// closeReasons are the reason labels of limitd_connections_closed_total.
var closeReasons = []string{"cap", "evicted", "idle", "refused"}

// guardedConn is one accepted connection.
type guardedConn struct {
	net.Conn
	g *ConnGuard

	// Guarded by g.mu.
	accepted time.Time
	seen     bool // a request was read from it
	authed   bool // it carried an authenticated /v1 request
	refused  time.Time
	idle     bool
	since    time.Time // when it went idle, or its request started
}

// Close implements net.Conn, forgetting the connection.
func (c *guardedConn) Close() error {
	c.g.forget(c)
	return c.Conn.Close()
}

// CloseWrite shuts the sending side of a TCP connection (net/http does
// before closing one, so the client reads the answer before the close).
func (c *guardedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (g *ConnGuard) forget(c *guardedConn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
}

// evictRank is how eagerly c is evicted at now: 1 (first) to 3, or 0 when
// it must not be. Lower ranks go first; within a rank, the earliest key.
func (g *ConnGuard) evictRank(c *guardedConn, now time.Time) (rank int, key time.Time) {
	switch {
	case !c.refused.IsZero():
		return 1, c.refused
	case c.authed:
		return 0, time.Time{}
	case !c.seen && now.Sub(c.accepted) < g.grace:
		return 0, time.Time{}
	case c.idle:
		return 2, c.since
	default:
		return 3, c.since
	}
}

// Listener wraps ln so that its connections are counted and bounded.
func (g *ConnGuard) Listener(ln net.Listener) net.Listener {
	return &guardedListener{Listener: ln, g: g}
}

type guardedListener struct {
	net.Listener
	g *ConnGuard
}

// Accept implements net.Listener.
func (l *guardedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.g.admit(c); gc != nil {
			return gc, nil
		}
	}
}

// admit registers c, evicting a connection when at the cap (see ConnGuard
// for which); it closes c and returns nil when none is evictable.
func (g *ConnGuard) admit(c net.Conn) *guardedConn {
	g.mu.Lock()
	now := g.now()
	var victim *guardedConn
	if len(g.conns) >= g.max {
		var vRank int
		var vKey time.Time
		for o := range g.conns {
			rank, key := g.evictRank(o, now)
			if rank != 0 && (victim == nil || rank < vRank || rank == vRank && key.Before(vKey)) {
				victim, vRank, vKey = o, rank, key
			}
		}
		if victim == nil {
			g.mu.Unlock()
			g.closed.WithLabelValues("cap").Inc()
			_ = c.Close()
			return nil
		}
		delete(g.conns, victim)
	}
	gc := &guardedConn{Conn: c, g: g, accepted: now, idle: true, since: now}
	g.conns[gc] = struct{}{}
	g.mu.Unlock()
	if victim != nil {
		g.closed.WithLabelValues("evicted").Inc()
		_ = victim.Conn.Close()
	}
	return gc
}

// ConnState is the http.Server's ConnState hook: it tracks which
// connections are idle, and since when. For HTTP/2 (h2c) net/http reports
// a connection active while it has a stream open and idle when it has
// none (and active then idle once its preface is read); StateNew and
// StateClosed as for HTTP/1.1.
func (g *ConnGuard) ConnState(c net.Conn, state http.ConnState) {
	gc, ok := c.(*guardedConn)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch state {
	case http.StateIdle:
		gc.idle, gc.since = true, g.now()
	case http.StateActive:
		if gc.idle {
			gc.idle, gc.since = false, g.now()
		}
	case http.StateClosed, http.StateHijacked:
		delete(g.conns, gc)
	}
}

// connKey is the context key of the *guardedConn serving a request.
type connKey struct{}

// ConnContext is the http.Server's ConnContext hook: it lets Server mark a
// request's connection. HTTP/2 requests carry it too (net/http derives a
// stream's context from its connection's).
func (g *ConnGuard) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if gc, ok := c.(*guardedConn); ok {
		return context.WithValue(ctx, connKey{}, gc)
	}
	return ctx
}

// ConnMark is what a server learned of a connection from one request.
type ConnMark int

// Marks of MarkRequest.
const (
	// ConnRequest: a request was read (its grace is over).
	ConnRequest ConnMark = iota
	// ConnAuthenticated: it carried an authenticated request; it is never
	// evicted nor swept.
	ConnAuthenticated
	// ConnRefused: it was answered 401 and is closing; it is evicted first
	// and closed by the next Sweep.
	ConnRefused
)

// MarkRequest records mark on the connection serving ctx's request, and
// reports whether that connection ever carried an authenticated request. A
// request not served through a ConnGuard is left alone (and reports false).
func MarkRequest(ctx context.Context, mark ConnMark) (authenticated bool) {
	gc, ok := ctx.Value(connKey{}).(*guardedConn)
	if !ok {
		return false
	}
	return gc.mark(mark)
}

// Mark records mark on c, a connection g's Listener accepted, as
// MarkRequest does for a request's; a server without a ConnContext hook
// (the gRPC door) calls it. Another net.Conn is left alone (false).
func (g *ConnGuard) Mark(c net.Conn, mark ConnMark) (authenticated bool) {
	gc, ok := c.(*guardedConn)
	if !ok || gc.g != g {
		return false
	}
	return gc.mark(mark)
}

func (gc *guardedConn) mark(mark ConnMark) (authenticated bool) {
	g := gc.g
	g.mu.Lock()
	defer g.mu.Unlock()
	gc.seen = true
	switch mark {
	case ConnAuthenticated:
		// A gateway's, whatever was refused on it before: no longer
		// closed as refused (an HTTP/1.1 connection refused after this is
		// marked again, and closes).
		gc.authed = true
		gc.refused = time.Time{}
	case ConnRefused:
		if gc.refused.IsZero() {
			gc.refused = g.now()
		}
	}
	return gc.authed
}

// Sweep closes every connection that never authenticated and has been idle
// since before now − UnauthenticatedIdle (a fresh one counts as idle since
// accepted, after its grace), or busy since before now −
// UnauthenticatedBusy when that is set, and every refused one, and returns
// how many.
func (g *ConnGuard) Sweep(now time.Time) int {
	type victim struct {
		c      *guardedConn
		reason string
	}
	var victims []victim
	g.mu.Lock()
	for c := range g.conns {
		rank, key := g.evictRank(c, now)
		switch {
		case rank == 1:
			victims = append(victims, victim{c, "refused"})
		case rank == 2 && now.Sub(key) >= g.idle:
			victims = append(victims, victim{c, "idle"})
		case rank == 3 && g.busy > 0 && now.Sub(key) >= g.busy:
			victims = append(victims, victim{c, "busy"})
		default:
			continue
		}
		delete(g.conns, c)
	}
	g.mu.Unlock()
	for _, v := range victims {
		g.closed.WithLabelValues(v.reason).Inc()
		_ = v.c.Conn.Close()
	}
	return len(victims)
}

// Len returns the connections open.
func (g *ConnGuard) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.conns)
}

// Bounds of each connection NewHTTPServer serves, HTTP/1.1 and HTTP/2 alike.
// A gateway's callout is a few hundred bytes of headers and a body of at
// most Limits.MaxBodyBytes, answered in milliseconds; the bounds are far
// above that and far below what would let one connection hold much memory.
const (
	// MaxStreamsPerConn is the most HTTP/2 streams (concurrent requests)
	// one connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS). A
	// gateway's cluster needs ceil(concurrent callouts / MaxStreamsPerConn)
	// connections per Envoy worker; at most this many handlers run per
	// connection.
	MaxStreamsPerConn = 250
	// MaxHeaderBytes bounds a request's headers: the HTTP/1.1 request line
	// and headers, or an HTTP/2 header list (SETTINGS_MAX_HEADER_LIST_SIZE).
	MaxHeaderBytes = 16 << 10
	// MaxHeaderTableBytes bounds HTTP/2's header compression table, per
	// connection (the protocol's default).
	MaxHeaderTableBytes = 4 << 10
	// MaxFrameBytes is the largest HTTP/2 frame read (the protocol's
	// minimum).
	MaxFrameBytes = 16 << 10
	// StreamWindowBytes is the HTTP/2 flow-control window of a request body
	// (what a client may send ahead of the handler's reads): one default
	// body (DefaultMaxBodyBytes).
	StreamWindowBytes = 64 << 10
	// ConnWindowBytes is the HTTP/2 flow-control window of a connection,
	// all its streams together: what it may buffer in limitd.
	ConnWindowBytes = 1 << 20
	// ReadHeaderTimeout bounds reading an HTTP/1.1 request's headers (or
	// the HTTP/2 preface of an h2c connection).
	ReadHeaderTimeout = 5 * time.Second
	// ReadTimeout bounds reading a whole request, body included (an HTTP/2
	// stream's body); WriteTimeout bounds writing an answer (an HTTP/2
	// stream's).
	ReadTimeout  = 10 * time.Second
	WriteTimeout = 10 * time.Second
	// IdleTimeout closes a connection, authenticated or not, that carried
	// no request for that long.
	IdleTimeout = 2 * time.Minute
	// WriteByteTimeout closes an HTTP/2 connection whose client stops
	// reading for that long while an answer waits to be written.
	WriteByteTimeout = 10 * time.Second
)

// NewHTTPServer returns an http.Server that serves h behind g: HTTP/1.1 and,
// on the same port, HTTP/2 over cleartext (h2c, prior knowledge: what an
// Envoy cluster with http2_protocol_options speaks), each connection held
// to the bounds above. Serve it on g.Listener(ln). errLog receives the
// server's own errors (nil: the log package's).
func NewHTTPServer(h http.Handler, g *ConnGuard, errLog *log.Logger) *http.Server {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         &protos,
		ConnState:         g.ConnState,
		ConnContext:       g.ConnContext,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          MaxStreamsPerConn,
			MaxDecoderHeaderTableSize:     MaxHeaderTableBytes,
			MaxEncoderHeaderTableSize:     MaxHeaderTableBytes,
			MaxReadFrameSize:              MaxFrameBytes,
			MaxReceiveBufferPerConnection: ConnWindowBytes,
			MaxReceiveBufferPerStream:     StreamWindowBytes,
			WriteByteTimeout:              WriteByteTimeout,
		},
		ErrorLog: errLog,
	}
}
