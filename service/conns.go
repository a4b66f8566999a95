package service

import (
	"context"
	"fmt"
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
	// Registerer, when set, receives limitd_connections_closed_total.
	Registerer prometheus.Registerer
}

// Defaults of ConnOptions.
const (
	DefaultMaxConns            = 512
	DefaultUnauthenticatedIdle = 5 * time.Second
)

// ConnGuard bounds an HTTP server's connections: at most MaxConns open, and
// connections that never authenticated closed once idle for
// UnauthenticatedIdle. A connection accepted at the cap first evicts the
// connection that has been idle longest among those that never
// authenticated; when there is none it is closed at once (the caller sees
// the connection reset), so the authenticated gateways are never pushed out
// by anonymous ones.
//
// Wire it with Listener, and the http.Server's ConnState and ConnContext;
// Server marks a connection authenticated when it serves an authorized /v1
// request on it; call Sweep periodically (limitd does every second) with
// the current time. A ConnGuard is safe for concurrent use.
type ConnGuard struct {
	max    int
	idle   time.Duration
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
	g := &ConnGuard{
		max:  opts.MaxConns,
		idle: opts.UnauthenticatedIdle,
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "limitd_connections_closed_total",
			Help: "Connections closed by the connection guard: reason cap (a new connection at the cap, none to evict), evicted (an idle unauthenticated one, for a new one) or idle (unauthenticated, idle too long).",
		}, []string{"reason"}),
		conns: make(map[*guardedConn]struct{}),
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(g.closed); err != nil {
			return nil, fmt.Errorf("service: connections: metrics: %w", err)
		}
	}
	return g, nil
}

// guardedConn is one accepted connection.
type guardedConn struct {
	net.Conn
	g *ConnGuard

	// Guarded by g.mu.
	authed    bool
	idle      bool
	idleSince time.Time
}

// Close implements net.Conn, forgetting the connection.
func (c *guardedConn) Close() error {
	c.g.forget(c)
	return c.Conn.Close()
}

func (g *ConnGuard) forget(c *guardedConn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
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

// admit registers c, evicting an idle unauthenticated connection when at the
// cap; it closes c and returns nil when there is none to evict.
func (g *ConnGuard) admit(c net.Conn) *guardedConn {
	g.mu.Lock()
	var victim *guardedConn
	if len(g.conns) >= g.max {
		for o := range g.conns {
			if o.idle && !o.authed && (victim == nil || o.idleSince.Before(victim.idleSince)) {
				victim = o
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
	// A connection that has sent nothing yet counts as idle since accepted:
	// it can be evicted (and swept) like one that went idle.
	gc := &guardedConn{Conn: c, g: g, idle: true, idleSince: time.Now()}
	g.conns[gc] = struct{}{}
	g.mu.Unlock()
	if victim != nil {
		g.closed.WithLabelValues("evicted").Inc()
		_ = victim.Conn.Close()
	}
	return gc
}

// ConnState is the http.Server's ConnState hook: it tracks which
// connections are idle, and since when.
func (g *ConnGuard) ConnState(c net.Conn, state http.ConnState) {
	gc, ok := c.(*guardedConn)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch state {
	case http.StateIdle:
		gc.idle, gc.idleSince = true, time.Now()
	case http.StateActive:
		gc.idle = false
	case http.StateClosed, http.StateHijacked:
		delete(g.conns, gc)
	}
}

// connKey is the context key of the *guardedConn serving a request.
type connKey struct{}

// ConnContext is the http.Server's ConnContext hook: it lets Server mark a
// request's connection authenticated.
func (g *ConnGuard) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if gc, ok := c.(*guardedConn); ok {
		return context.WithValue(ctx, connKey{}, gc)
	}
	return ctx
}

// markAuthenticated records that the connection serving ctx's request
// carried an authorized /v1 request; a request not served through a
// ConnGuard is left alone.
func markAuthenticated(ctx context.Context) {
	gc, ok := ctx.Value(connKey{}).(*guardedConn)
	if !ok {
		return
	}
	gc.g.mu.Lock()
	gc.authed = true
	gc.g.mu.Unlock()
}

// Sweep closes every connection that never authenticated and has been idle
// since before now − UnauthenticatedIdle, and returns how many.
func (g *ConnGuard) Sweep(now time.Time) int {
	var victims []*guardedConn
	g.mu.Lock()
	for c := range g.conns {
		if c.idle && !c.authed && now.Sub(c.idleSince) >= g.idle {
			delete(g.conns, c)
			victims = append(victims, c)
		}
	}
	g.mu.Unlock()
	for _, c := range victims {
		g.closed.WithLabelValues("idle").Inc()
		_ = c.Conn.Close()
	}
	return len(victims)
}

// Len returns the connections open.
func (g *ConnGuard) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.conns)
}
