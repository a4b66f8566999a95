package rlqs

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/grpcdoor"
	"github.com/ratelimit-wasm/tokenbucket/service/rls"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

var epoch = time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// clock is a settable clock shared by a memory store and a Server.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// quotaYAML: 40 a minute per api_key value, 600 a minute with a burst of 1200
// per team, an unlimited key, a limit of 0, a fixed window, a shadow limit,
// a nested descriptor, and a level with two keys (ambiguous together).
const quotaYAML = `
domain: quota
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 40}
  - key: team
    rate_limit: {unit: minute, requests_per_unit: 600, burst: 1200}
  - key: free
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 100}
  - key: other
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: counted
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: watched
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// fixture is a quota service served over gRPC on a loopback port.
type fixture struct {
	t     *testing.T
	store service.Store
	clock *clock
	srv   *Server
	rls   *rls.Server
	grpc  *grpcdoor.Host
	conn  *grpc.ClientConn
	reg   *prometheus.Registry
}

type fixtureOpts struct {
	store     service.Store
	clock     *clock
	unmatched Unmatched
	tokens    []service.Token
	ttl       time.Duration
	bounds    *bounds // nil: the defaults
	// maxKeyBytes is the rate limit service's (its --max-key-bytes).
	maxKeyBytes int
	// resetsPerSecond and resetBurst: the door's reset budget (0: its
	// defaults), raised by tests that drop streams on purpose.
	resetsPerSecond float64
	resetBurst      int
	replicas        int
	algorithm       rlsconfig.Algorithm
	// identities and identityHeader: a front proxy's callers.
	identities     []service.Identity
	identityHeader string
}

func memoryStore(c *clock) service.Store {
	return service.NewMemoryStore(service.MemoryOptions{Now: func() int64 { return c.Now().UnixNano() }})
}

// stores runs test on the memory store (on c's clock) and on a real
// redis-server (on its own clock).
func stores(t *testing.T, test func(t *testing.T, st service.Store, c *clock)) {
	t.Run("memory", func(t *testing.T) {
		c := &clock{t: epoch}
		test(t, memoryStore(c), c)
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { client.Close() })
		st, err := service.NewRedisStore(client, service.RedisOptions{})
		if err != nil {
			t.Fatal(err)
		}
		test(t, st, &clock{t: epoch})
	})
}

func start(t *testing.T, yaml string, o fixtureOpts) *fixture {
	t.Helper()
	if o.clock == nil {
		o.clock = &clock{t: epoch}
	}
	if o.store == nil {
		o.store = memoryStore(o.clock)
	}
	cfg, err := rlsconfig.Parse([]rlsconfig.File{{Name: "config.yaml", Data: []byte(yaml)}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := rls.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	rsrv, err := rls.NewServer(rls.Options{Store: o.store, Algorithm: o.algorithm, MaxKeyBytes: o.maxKeyBytes, Logger: quiet, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	rsrv.SetConfig(cfg)
	f := &fixture{t: t, store: o.store, clock: o.clock, rls: rsrv, reg: prometheus.NewRegistry()}
	qm, err := NewMetrics(f.reg)
	if err != nil {
		t.Fatal(err)
	}
	f.srv, err = NewServer(Options{Store: o.store, Config: rsrv.Config, Naming: rsrv.Naming(), Unmatched: o.unmatched,
		TTL: o.ttl, Replicas: o.replicas, Algorithm: o.algorithm, Now: o.clock.Now, Logger: quiet, Metrics: qm})
	if err != nil {
		t.Fatal(err)
	}
	if o.bounds != nil {
		f.srv.bounds = *o.bounds
	}
	f.grpc, err = grpcdoor.New(grpcdoor.Options{Tokens: o.tokens, Identities: o.identities, IdentityHeader: o.identityHeader,
		ResetsPerSecond: o.resetsPerSecond, ResetBurst: o.resetBurst, Codec: Codec{}})
	if err != nil {
		t.Fatal(err)
	}
	rsrv.Register(f.grpc.Server())
	f.srv.Register(f.grpc.Server())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.grpc.Serve(ln) }()
	f.conn, err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.conn.Close()
		f.grpc.Stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return f
}

// streamBound bounds a test's stream: a hang, not a slow run. A stream
// lives as long as its test, which under -race on a loaded machine took
// over a minute (the bound was 60 s: TestChurningGateway's honest stream
// ended in the middle of its run).
const streamBound = 10 * time.Minute

// open opens a stream as Envoy's filter does, with token (none: "").
func (f *fixture) open(token string) (rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient, context.CancelFunc) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), streamBound)
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	s, err := rlqspb.NewRateLimitQuotaServiceClient(f.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		f.t.Fatal(err)
	}
	f.t.Cleanup(cancel)
	return s, cancel
}

// usage is one bucket's part of a report.
func usage(id map[string]string, allowed, denied uint64, elapsed time.Duration) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           &rlqspb.BucketId{Bucket: id},
		TimeElapsed:        durationpb.New(elapsed),
		NumRequestsAllowed: allowed,
		NumRequestsDenied:  denied,
	}
}

// exchange sends one report and reads the answer.
func exchange(t *testing.T, s rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient, domain string,
	us ...*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage,
) *rlqspb.RateLimitQuotaResponse {
	t.Helper()
	if err := s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}); err != nil {
		t.Fatalf("send: %v", err)
	}
	r, err := s.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return r
}

// envoy models how Envoy 1.40's quota filter applies assignments to one
// bucket (source/extensions/filters/http/rate_limit_quota,
// global_client_impl.cc): a token_bucket assignment starts a new bucket,
// full at max_tokens and refilled continuously at tokens_per_fill over
// fill_interval truncated to whole seconds, unless it has the same
// max_tokens, tokens_per_fill and fill_interval nanos as the one in force,
// which then goes on with its tokens and its rate; an assignment ends after its TTL (whole
// seconds) and the bucket then falls back to no_assignment_behavior,
// DENY_ALL here (as the bound requires). Allowed and denied requests are
// counted until the next report.
type envoy struct {
	id      map[string]string
	tb      *typev3.TokenBucket
	rate    float64 // of the bucket in force: the assignment that started it
	blanket typev3.RateLimitStrategy_BlanketRule
	has     bool // an assignment is in force
	tokens  float64
	at      time.Time // of tokens
	expiry  time.Time
	allowed uint64
	denied  uint64
	total   uint64 // allowed over the whole test
	last    time.Time
}

func newEnvoy(id map[string]string, now time.Time) *envoy { return &envoy{id: id, last: now} }

func (e *envoy) apply(a *rlqspb.RateLimitQuotaResponse_BucketAction, now time.Time) {
	q := a.GetQuotaAssignmentAction()
	if q == nil { // abandon
		e.has, e.tb = false, nil
		return
	}
	ttl := time.Duration(q.AssignmentTimeToLive.GetSeconds()) * time.Second
	tb := q.RateLimitStrategy.GetTokenBucket()
	if tb == nil {
		e.has, e.tb, e.blanket, e.expiry = true, nil, q.RateLimitStrategy.GetBlanketRule(), now.Add(ttl)
		return
	}
	e.refill(now)
	// Envoy 1.40 compares fill_interval by its nanos only: two intervals of
	// whole seconds are the same to it.
	same := e.has && e.tb != nil && e.tb.MaxTokens == tb.MaxTokens && e.tb.TokensPerFill.GetValue() == tb.TokensPerFill.GetValue() &&
		e.tb.FillInterval.GetNanos() == tb.FillInterval.GetNanos()
	if !same {
		e.tokens, e.at = float64(tb.MaxTokens), now
		e.rate = float64(tb.TokensPerFill.GetValue()) / math.Floor(tb.FillInterval.AsDuration().Seconds())
	}
	e.has, e.tb, e.expiry = true, tb, now.Add(ttl)
}

func (e *envoy) refill(now time.Time) {
	if !e.has || e.tb == nil {
		return
	}
	if !now.Before(e.expiry) {
		e.has, e.tb = false, nil
		return
	}
	e.tokens = math.Min(float64(e.tb.MaxTokens), e.tokens+e.rate*now.Sub(e.at).Seconds())
	e.at = now
}

// request is one request at now: allowed or not.
func (e *envoy) request(now time.Time) bool {
	e.refill(now)
	ok := false
	switch {
	case !e.has:
	case e.tb == nil:
		ok = e.blanket == typev3.RateLimitStrategy_ALLOW_ALL
	case e.tokens >= 1:
		e.tokens--
		ok = true
	}
	if ok {
		e.allowed++
		e.total++
	} else {
		e.denied++
	}
	return ok
}

// report is the bucket's usage since the last report, as Envoy sends it.
func (e *envoy) report(now time.Time) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	u := usage(e.id, e.allowed, e.denied, now.Sub(e.last).Truncate(time.Second))
	e.allowed, e.denied, e.last = 0, 0, now
	return u
}

// tb returns the token bucket of an action, failing the test on another.
func tokenBucket(t *testing.T, a *rlqspb.RateLimitQuotaResponse_BucketAction) (*typev3.TokenBucket, time.Duration) {
	t.Helper()
	q := a.GetQuotaAssignmentAction()
	if q == nil || q.RateLimitStrategy.GetTokenBucket() == nil {
		t.Fatalf("want a token_bucket assignment, got %v", a)
	}
	return q.RateLimitStrategy.GetTokenBucket(), q.AssignmentTimeToLive.AsDuration()
}

func blanket(t *testing.T, a *rlqspb.RateLimitQuotaResponse_BucketAction) typev3.RateLimitStrategy_BlanketRule {
	t.Helper()
	q := a.GetQuotaAssignmentAction()
	if q == nil || q.RateLimitStrategy.GetTokenBucket() != nil {
		t.Fatalf("want a blanket rule, got %v", a)
	}
	return q.RateLimitStrategy.GetBlanketRule()
}
