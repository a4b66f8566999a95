package rls

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/service"
)

// ServiceName is the gRPC service the front door serves, and the name its
// health is reported under.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Bounds of the gRPC listener (GRPCOptions' defaults).
const (
	// DefaultMaxRecvBytes bounds one request message.
	DefaultMaxRecvBytes = 64 << 10
	// DefaultMaxStreams bounds the calls in flight on one connection.
	DefaultMaxStreams = 256
	// DefaultMaxConns bounds the connections open at once.
	DefaultMaxConns = 1024
	// DefaultMaxHeaderBytes bounds a call's metadata.
	DefaultMaxHeaderBytes = 16 << 10
	// KeepaliveMinTime is the least interval between a client's keepalive
	// pings; a client that pings faster is disconnected.
	KeepaliveMinTime = 10 * time.Second
	// MaxConnectionIdle closes a connection idle that long.
	MaxConnectionIdle = 5 * time.Minute
	// HandshakeTimeout bounds a connection's set-up.
	HandshakeTimeout = 5 * time.Second
)

// GRPCOptions configure the gRPC server of a Server. Zero fields mean the
// defaults.
type GRPCOptions struct {
	// Tokens are the bearer tokens a call must carry in its authorization
	// metadata ("Bearer <token>"), one per caller; none: no token needed.
	Tokens []service.Token
	// MaxRecvBytes bounds one request message (DefaultMaxRecvBytes).
	MaxRecvBytes int
	// MaxStreams bounds the calls in flight per connection
	// (DefaultMaxStreams).
	MaxStreams uint32
	// MaxConns bounds the connections open at once (DefaultMaxConns):
	// further ones wait to be accepted.
	MaxConns int
	// Codec, when set, is the codec of every call (the quota service's
	// rlqs.Codec, which reads the reports gRPC's proto codec refuses).
	Codec encoding.CodecV2
}

// GRPC is the gRPC server of a rate limit service: ShouldRateLimit and the
// standard health service (grpc.health.v1), its status NOT_SERVING until
// the store is ready (SetServing).
type GRPC struct {
	srv      *grpc.Server
	health   *health.Server
	maxConns int
}

// NewGRPC returns the gRPC server of s.
func NewGRPC(s *Server, opts GRPCOptions) (*GRPC, error) {
	if opts.MaxRecvBytes <= 0 {
		opts.MaxRecvBytes = DefaultMaxRecvBytes
	}
	if opts.MaxStreams == 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	a, err := newAuth(opts.Tokens, s.metrics)
	if err != nil {
		return nil, err
	}
	var extra []grpc.ServerOption
	if opts.Codec != nil {
		extra = append(extra, grpc.ForceServerCodecV2(opts.Codec))
	}
	srv := grpc.NewServer(append(extra,
		grpc.MaxRecvMsgSize(opts.MaxRecvBytes),
		grpc.MaxConcurrentStreams(opts.MaxStreams),
		grpc.MaxHeaderListSize(DefaultMaxHeaderBytes),
		grpc.ConnectionTimeout(HandshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: MaxConnectionIdle}),
		grpc.UnaryInterceptor(a.unary),
		grpc.StreamInterceptor(a.stream),
	)...)
	pb.RegisterRateLimitServiceServer(srv, s)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	h.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(srv, h)
	return &GRPC{srv: srv, health: h, maxConns: opts.MaxConns}, nil
}

// SetServing sets the health of the service and the server ("").
func (g *GRPC) SetServing(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	g.health.SetServingStatus("", st)
	g.health.SetServingStatus(ServiceName, st)
}

// CheckStore pings the store once and sets the health from the answer.
func (g *GRPC) CheckStore(ctx context.Context, st service.Store, timeout time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := st.Ping(pctx)
	if ctx.Err() == nil {
		g.SetServing(err == nil)
	}
	return err
}

// WatchStore runs CheckStore every period until ctx ends.
func (g *GRPC) WatchStore(ctx context.Context, st service.Store, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		_ = g.CheckStore(ctx, st, period)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Serve serves ln (at most MaxConns connections at once) until Stop.
func (g *GRPC) Serve(ln net.Listener) error {
	err := g.srv.Serve(netutil.LimitListener(ln, g.maxConns))
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// GracefulStop stops accepting, lets the calls in flight finish, and
// returns; after ctx ends it stops them too.
func (g *GRPC) GracefulStop(ctx context.Context) {
	g.health.Shutdown()
	done := make(chan struct{})
	go func() { g.srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		g.srv.Stop()
		<-done
	}
}

// Stop closes every connection and call at once.
func (g *GRPC) Stop() { g.srv.Stop() }

// auth checks the bearer token of every call but the health service's.
type auth struct {
	names   []string // names[i] is the caller of bearer's i-th token
	bearer  service.BearerTokens
	metrics *Metrics
}

func newAuth(tokens []service.Token, m *Metrics) (*auth, error) {
	a := &auth{metrics: m}
	seen := map[string]bool{}
	for i, t := range tokens {
		switch {
		case t.Name == "" || t.Value == "":
			return nil, fmt.Errorf("rls: tokens[%d]: name and value are required", i)
		case seen[t.Name]:
			return nil, fmt.Errorf("rls: tokens[%d].name: %q named twice", i, t.Name)
		}
		seen[t.Name] = true
		a.bearer.Add(t.Value)
		a.names = append(a.names, t.Name)
		m.authorized.WithLabelValues(t.Name)
	}
	return a, nil
}

// check returns nil when ctx's metadata carries one of the tokens (or none
// is needed), comparing every token in constant time.
func (a *auth) check(ctx context.Context, method string) error {
	if a.bearer.Len() == 0 || strings.HasPrefix(method, "/grpc.health.v1.Health/") {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if vals := md.Get("authorization"); len(vals) == 1 {
		if i := a.bearer.Match(vals[0]); i >= 0 {
			a.metrics.authorized.WithLabelValues(a.names[i]).Inc()
			return nil
		}
	}
	a.metrics.unauthorized.Inc()
	return status.Error(codes.Unauthenticated, "rls: authorization: missing or wrong bearer token")
}

func (a *auth) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := a.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *auth) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := a.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
