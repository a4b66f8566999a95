// Package rlqs is the service's third front door: Envoy's rate limit quota
// service (envoy.service.rate_limit_quota.v3.RateLimitQuotaService, one
// bidirectional stream per Envoy of usage reports and quota assignments),
// served by Envoy's own rate_limit_quota filter. Its limits are the rate
// limit service's (package rlsconfig, the same --rls-config YAML); each
// limit's rate and burst are divided between the Envoys reporting it by an
// Allocator, which leases nothing: the assignments in force sum to at most
// the limit's rate and burst, so the fleet never admits more than
// burst + rate × t (per replica: Options.Replicas).
//
// # Buckets
//
// A report's bucket_id is an unordered map; Config.Order reads it as a
// descriptor of the report's domain by walking the domain's tree from the
// root, taking at each level the one remaining key the level's descriptors
// name. A map that is no path of the tree (or leaves keys unused) is
// unmatched and gets the Unmatched default (blanket ALLOW_ALL or DENY_ALL);
// a map that names two keys of one level is ambiguous and gets the same
// default, counted apart. A matched token_bucket limit is the bucket
// service.Decide would decide for ShouldRateLimit: rls.BucketKey, the
// limit's rate and capacity. An unlimited, shadow_mode or quota_mode limit
// is ALLOW_ALL; a limit of 0, or a fixed_window limit (its own algorithm or
// Options.Algorithm: a counter ShouldRateLimit keeps, not a token bucket to
// divide), DENY_ALL.
//
// # Assignments
//
// For each bucket of a report, the Allocator (allocator.go) gives the
// stream its demand's fair fraction (share.go) of the limit's rate and of
// its burst, as far as the assignments still counted leave room, and pays
// for each new Envoy bucket's max_tokens from the limit's free tokens. It
// is sent as a token_bucket (max_tokens, tokens_per_fill per whole-second
// fill_interval, as Envoy 1.40 reads it: its rate is tokens_per_fill over
// the interval truncated to seconds) with an assignment_time_to_live of at
// least TTL and MinTTLReports reporting intervals. A shape within 15% of
// the last one sent is sent again unchanged, so Envoy keeps its bucket and
// its tokens. A stream's end or an abandoned bucket leaves what it was
// assigned counted until its TTL has passed (Envoy keeps its assignments
// until then). A bucket reported idle for AbandonAfter is abandoned
// (abandon_action: Envoy drops it and stops reporting it). A reload reaches
// the buckets that keep reporting: each report reads its bucket's limit
// again from a configuration loaded since.
//
// # Bounds
//
// Streams at once (MaxStreams, MaxStreamsPerCaller: ResourceExhausted),
// buckets per stream (MaxBuckets: ResourceExhausted), usages per report
// (MaxUsages), bucket_id entries (rls.MaxEntries) and their bytes
// (MaxEntryBytes), domain bytes (MaxDomainBytes): InvalidArgument. Reports
// per stream are a token bucket of ReportBurst refilled at ReportRate a
// second (ResourceExhausted past it). Counts are clamped to MaxCount and
// time_elapsed to [0, MaxElapsed]. Each status ends the stream; Envoy
// opens another at its next report.
package rlqs

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rls"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// ServiceName is the gRPC service served.
const ServiceName = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"

// Bounds of what a client sends.
const (
	// MaxStreams bounds the streams open at once.
	MaxStreams = 256
	// MaxStreamsPerCaller bounds the streams of one caller (token name).
	MaxStreamsPerCaller = 64
	// MaxBuckets bounds the buckets one stream reports.
	MaxBuckets = 256
	// MaxUsages bounds the bucket usages of one report.
	MaxUsages = MaxBuckets
	// MaxEntryBytes bounds a bucket_id key or value.
	MaxEntryBytes = 256
	// MaxDomainBytes bounds the domain.
	MaxDomainBytes = 256
	// MaxCount clamps a report's allowed or denied count.
	MaxCount = 1 << 32
	// MaxElapsed clamps a report's time_elapsed.
	MaxElapsed = time.Hour
	// MaxTTL bounds the life a long reporting interval gives assignments.
	MaxTTL = 5 * time.Minute
	// ReportBurst and ReportRate bound the reports of one stream: a token
	// bucket of ReportBurst reports refilled at ReportRate a second
	// (Envoy sends one per reporting interval and one per new bucket).
	ReportBurst = MaxBuckets
	ReportRate  = 10
)

// Reserve is the part of a limit's burst no stream's max_tokens is sized
// from, and the part of its free tokens a stream whose bucket is in force
// leaves when it does not shrink (Allocator), so that a new Envoy gets
// tokens at its first report while the others' shares hold the rest.
const Reserve = 0.125

// MaxFill is the longest fill_interval, in seconds, of the intervals tried
// to express a rate below MaxFill a second as tokens_per_fill over a whole
// number of seconds (Envoy truncates the interval to seconds).
const MaxFill = 60

// Defaults of Options.
const (
	// DefaultTTL is an assignment's least life.
	DefaultTTL = 10 * time.Second
	// DefaultGrace is the time a report and an assignment may take over the
	// stream, covered by every lease.
	DefaultGrace = time.Second
	// DefaultAbandonAfter is how long a bucket is reported idle before it
	// is abandoned.
	DefaultAbandonAfter = time.Minute
)

// Unmatched is what a bucket that matches no limit gets.
type Unmatched uint8

const (
	// AllowUnmatched: blanket ALLOW_ALL.
	AllowUnmatched Unmatched = iota
	// DenyUnmatched: blanket DENY_ALL.
	DenyUnmatched
)

// ParseUnmatched reads "allow" or "deny".
func ParseUnmatched(s string) (Unmatched, error) {
	switch s {
	case "allow":
		return AllowUnmatched, nil
	case "deny":
		return DenyUnmatched, nil
	}
	return 0, fmt.Errorf("rlqs: unmatched: want allow or deny, got %q", s)
}

// Options configure a Server. Store and Config are required.
type Options struct {
	// Store is the service's store (the HTTP API's and ShouldRateLimit's);
	// the Allocator keeps its counts in memory, not there.
	Store service.Store
	// Config returns the configuration in use (the rate limit service's:
	// rls.Server.Config); nil means none yet (streams get Unavailable).
	Config func() *rlsconfig.Config
	// Tokens are the bearer tokens (as the gRPC server's): the caller's
	// name, for the ledger and MaxStreamsPerCaller, is the matching one's.
	// None: every caller is service.DefaultCaller.
	Tokens []service.Token
	// Unmatched is the answer to a bucket that matches no limit.
	Unmatched Unmatched
	// TTL is an assignment's least life (DefaultTTL), in whole seconds,
	// raised to MinTTLReports reporting intervals (up to MaxTTL).
	TTL time.Duration
	// Grace (DefaultGrace) is the longest an assignment takes to reach
	// Envoy: each is counted for TTL + Grace (Allocator).
	Grace time.Duration
	// Replicas (default 1) is the number of limitd processes serving the
	// quota service for one set of limits: each divides 1/Replicas of every
	// limit (AllocOptions.Replicas).
	Replicas int
	// Algorithm is the rate limit service's algorithm for limits that name
	// none (rls.Options.Algorithm; Default: token_bucket). Fixed-window
	// limits are DENY_ALL here.
	Algorithm rlsconfig.Algorithm
	// AbandonAfter (DefaultAbandonAfter) is how long a bucket is reported
	// idle before the stream abandons it.
	AbandonAfter time.Duration
	// Timeout bounds each store call (service.DefaultTimeout). A failed
	// call leaves the bucket's assignment in force until its TTL.
	Timeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
	// Metrics receives the statistics (NewMetrics; nil: none kept).
	Metrics *Metrics
}

// Server implements rlqspb.RateLimitQuotaServiceServer.
type Server struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer

	opts   Options
	tokens []authToken
	alloc  *Allocator

	mu       sync.Mutex
	nextID   uint64
	streams  map[uint64]*stream
	byCaller map[string]int
	closing  bool
	// abandonOnClose: Shutdown abandons the streams' buckets.
	abandonOnClose bool
	// fixedLogged: the fixed-window limits whose DENY_ALL was logged.
	fixedLogged sync.Map
}

type authToken struct {
	sum  [sha256.Size]byte
	name string
}

// NewServer returns a Server for opts.
func NewServer(opts Options) (*Server, error) {
	if opts.Store == nil {
		return nil, errors.New("rlqs: options: store: required")
	}
	if opts.Config == nil {
		return nil, errors.New("rlqs: options: config: required")
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	opts.TTL = opts.TTL.Truncate(time.Second)
	if opts.TTL < time.Second {
		return nil, errors.New("rlqs: options: ttl: at least 1s")
	}
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	if opts.AbandonAfter <= 0 {
		opts.AbandonAfter = DefaultAbandonAfter
	}
	if opts.Timeout <= 0 {
		opts.Timeout = service.DefaultTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{opts: opts, streams: map[uint64]*stream{}, byCaller: map[string]int{},
		alloc: NewAllocator(AllocOptions{TTL: opts.TTL, Grace: opts.Grace, Replicas: opts.Replicas})}
	for _, t := range opts.Tokens {
		s.tokens = append(s.tokens, authToken{sum: sha256.Sum256([]byte(t.Value)), name: t.Name})
	}
	return s, nil
}

// Register registers s on g (on the rate limit service's gRPC server).
func (s *Server) Register(g *grpc.Server) { rlqspb.RegisterRateLimitQuotaServiceServer(g, s) }

// caller names the caller of ctx by its bearer token (checked already by the
// gRPC server's interceptor).
func (s *Server) caller(ctx context.Context) string {
	if len(s.tokens) == 0 {
		return service.DefaultCaller
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	const scheme = "bearer "
	if len(vals) != 1 || len(vals[0]) <= len(scheme) || !strings.EqualFold(vals[0][:len(scheme)], scheme) {
		return ""
	}
	sum := sha256.Sum256([]byte(vals[0][len(scheme):]))
	name := ""
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(sum[:], s.tokens[i].sum[:]) == 1 {
			name = s.tokens[i].name
		}
	}
	return name
}

// stream is one open StreamRateLimitQuotas call: one Envoy.
type stream struct {
	id      uint64
	caller  string
	quit    chan struct{} // closed by Shutdown
	mu      sync.Mutex    // held while a report is handled
	srv     rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer
	domain  string
	buckets map[string]*bucket // by bucket_id's canonical form
	reports float64            // report tokens left (ReportBurst, ReportRate)
	last    time.Time          // when reports was last refilled
}

// shape is an assignment: a token bucket, or a blanket rule.
type shape struct {
	blanket typev3.RateLimitStrategy_BlanketRule // used when max == 0
	max     uint32                               // max_tokens; 0: blanket
	perFill uint32                               // tokens_per_fill
	fill    int64                                // fill_interval, seconds
}

func (sh shape) rate() float64 {
	if sh.max == 0 {
		return 0
	}
	return float64(sh.perFill) / float64(sh.fill)
}

// most is what Envoy can admit under sh over d from a full bucket.
func (sh shape) most(d time.Duration) float64 {
	if sh.max == 0 {
		if sh.blanket == typev3.RateLimitStrategy_ALLOW_ALL {
			return math.Inf(1)
		}
		return 0
	}
	return float64(sh.max) + sh.rate()*d.Seconds()
}

// bucket is one bucket of a stream. The stream code sets id, idle and
// (newBucket, refresh) cfg, key, rate, burst and, for a bucket not
// divided (key ""), sent: its blanket rule.
type bucket struct {
	id    *rlqspb.BucketId
	cfg   *rlsconfig.Config // the configuration its limit was read from
	key   string            // the store's bucket key; "" when not divided
	rate  float64
	burst float64
	sent  shape
	idle  time.Time // since when reported idle; zero: busy
}

// StreamRateLimitQuotas serves one Envoy.
func (s *Server) StreamRateLimitQuotas(srv rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	caller := s.caller(srv.Context())
	if caller == "" {
		return s.opts.Metrics.refuse(status.Error(codes.Unauthenticated, "rlqs: authorization: missing or wrong bearer token"))
	}
	st, err := s.open(caller, srv)
	if err != nil {
		return s.opts.Metrics.refuse(err)
	}
	defer s.close(st)
	type recv struct {
		msg *rlqspb.RateLimitQuotaUsageReports
		err error
	}
	in := make(chan recv)
	go func() {
		for {
			msg, err := srv.Recv()
			select {
			case in <- recv{msg, err}:
			case <-srv.Context().Done():
				return
			case <-st.quit:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		var r recv
		select {
		case r = <-in:
		case <-st.quit:
			return s.goodbye(st)
		}
		if errors.Is(r.err, io.EOF) {
			return nil
		}
		if r.err != nil {
			return r.err
		}
		st.mu.Lock()
		resp, err := s.report(st, r.msg)
		st.mu.Unlock()
		if err != nil {
			return s.opts.Metrics.refuse(err)
		}
		if len(resp.BucketAction) == 0 {
			continue
		}
		if err := srv.Send(resp); err != nil {
			return err
		}
		s.opts.Metrics.sent(resp)
	}
}

// Shutdown ends every stream, now and from now on: each is told, when
// abandon is set, to abandon its buckets (Envoy then falls back to its
// no_assignment_behavior), else nothing (Envoy keeps its assignments until
// their TTL, then its expired_assignment_behavior or no_assignment_behavior
// applies); then it ends with Unavailable. Call it before the gRPC server's
// GracefulStop, which waits for the streams to end.
func (s *Server) Shutdown(abandon bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return
	}
	s.closing, s.abandonOnClose = true, abandon
	for _, st := range s.streams {
		close(st.quit)
	}
}

// goodbye is a stream's end at Shutdown.
func (s *Server) goodbye(st *stream) error {
	if s.abandonOnClose {
		st.mu.Lock()
		resp := &rlqspb.RateLimitQuotaResponse{}
		for _, b := range st.buckets {
			resp.BucketAction = append(resp.BucketAction, &rlqspb.RateLimitQuotaResponse_BucketAction{
				BucketId: b.id,
				BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
					AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{},
				},
			})
		}
		st.mu.Unlock()
		if len(resp.BucketAction) > 0 {
			_ = st.srv.Send(resp)
		}
		return status.Error(codes.Unavailable, "rlqs: limitd shutting down: buckets abandoned")
	}
	return status.Error(codes.Unavailable, "rlqs: limitd shutting down: assignments stand until their TTL")
}

func (s *Server) open(caller string, srv rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) (*stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closing:
		return nil, status.Error(codes.Unavailable, "rlqs: shutting down")
	case len(s.streams) >= MaxStreams:
		return nil, status.Errorf(codes.ResourceExhausted, "rlqs: streams: at most %d open at once", MaxStreams)
	case s.byCaller[caller] >= MaxStreamsPerCaller:
		return nil, status.Errorf(codes.ResourceExhausted, "rlqs: streams: at most %d open at once per caller", MaxStreamsPerCaller)
	}
	s.nextID++
	st := &stream{id: s.nextID, caller: caller, srv: srv, buckets: map[string]*bucket{}, quit: make(chan struct{}),
		reports: ReportBurst, last: s.opts.Now()}
	s.streams[st.id] = st
	s.byCaller[caller]++
	if m := s.opts.Metrics; m != nil {
		m.streams.Inc()
	}
	return st, nil
}

// close ends st: its demands leave the shares, and what its buckets hold
// beyond what Envoy could still admit is returned.
func (s *Server) close(st *stream) {
	s.mu.Lock()
	if m := s.opts.Metrics; m != nil {
		m.streams.Dec()
	}
	delete(s.streams, st.id)
	if s.byCaller[st.caller]--; s.byCaller[st.caller] <= 0 {
		delete(s.byCaller, st.caller)
	}
	s.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, b := range st.buckets {
		s.release(st, b)
	}
}

// report handles one usage report and returns the assignments to send.
func (s *Server) report(st *stream, msg *rlqspb.RateLimitQuotaUsageReports) (*rlqspb.RateLimitQuotaResponse, error) {
	now := s.opts.Now()
	if m := s.opts.Metrics; m != nil {
		m.reports.Inc()
	}
	if err := st.admitReport(now); err != nil {
		return nil, err
	}
	if err := s.checkReport(st, msg); err != nil {
		return nil, err
	}
	cfg := s.opts.Config()
	if cfg == nil {
		return nil, status.Error(codes.Unavailable, "rlqs: no configuration loaded yet")
	}
	ctx := service.WithCaller(st.srv.Context(), st.caller)
	resp := &rlqspb.RateLimitQuotaResponse{}
	for _, u := range msg.BucketQuotaUsages {
		id := canonical(u.BucketId)
		b := st.buckets[id]
		if b == nil {
			if len(st.buckets) >= MaxBuckets {
				return nil, status.Errorf(codes.ResourceExhausted, "rlqs: buckets: at most %d per stream", MaxBuckets)
			}
			b = s.newBucket(cfg, st.domain, u.BucketId)
			st.buckets[id] = b
		} else if b.cfg != cfg {
			b = s.refresh(st, b, cfg)
			st.buckets[id] = b
		}
		allowed := float64(min(u.NumRequestsAllowed, MaxCount))
		denied := float64(min(u.NumRequestsDenied, MaxCount))
		elapsed := min(max(u.TimeElapsed.AsDuration(), 0), MaxElapsed)
		act, err := s.assign(ctx, st, b, allowed, denied, elapsed, now)
		if err != nil {
			return nil, err
		}
		if act != nil {
			resp.BucketAction = append(resp.BucketAction, act)
		}
	}
	return resp, nil
}

// admitReport takes one report from st's report budget.
func (st *stream) admitReport(now time.Time) error {
	if d := now.Sub(st.last); d > 0 {
		st.reports = math.Min(ReportBurst, st.reports+d.Seconds()*ReportRate)
		st.last = now
	}
	if st.reports < 1 {
		return status.Errorf(codes.ResourceExhausted, "rlqs: reports: at most %d a second after a burst of %d", ReportRate, ReportBurst)
	}
	st.reports--
	return nil
}

// checkReport bounds a report and fixes the stream's domain.
func (s *Server) checkReport(st *stream, msg *rlqspb.RateLimitQuotaUsageReports) error {
	switch {
	case len(msg.Domain) > MaxDomainBytes:
		return status.Errorf(codes.InvalidArgument, "rlqs: domain: at most %d bytes", MaxDomainBytes)
	case st.domain == "" && msg.Domain == "":
		return status.Error(codes.InvalidArgument, "rlqs: domain: required in the first report")
	case st.domain != "" && msg.Domain != "" && msg.Domain != st.domain:
		return status.Errorf(codes.InvalidArgument, "rlqs: domain: %q, but the stream's is %q", msg.Domain, st.domain)
	case len(msg.BucketQuotaUsages) > MaxUsages:
		return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages: at most %d per report, got %d", MaxUsages, len(msg.BucketQuotaUsages))
	}
	if st.domain == "" {
		st.domain = msg.Domain
	}
	for i, u := range msg.BucketQuotaUsages {
		if u.BucketId == nil || len(u.BucketId.Bucket) == 0 {
			return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages[%d].bucket_id: required", i)
		}
		if len(u.BucketId.Bucket) > rls.MaxEntries {
			return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages[%d].bucket_id: at most %d entries", i, rls.MaxEntries)
		}
		for k, v := range u.BucketId.Bucket {
			if len(k) == 0 || len(k) > MaxEntryBytes || len(v) > MaxEntryBytes {
				return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages[%d].bucket_id: keys of 1 to %d bytes, values up to %d", i, MaxEntryBytes, MaxEntryBytes)
			}
		}
	}
	return nil
}

// canonical is a bucket_id's map as one string, its keys sorted.
func canonical(id *rlqspb.BucketId) string {
	keys := make([]string, 0, len(id.Bucket))
	for k := range id.Bucket {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%d:%s=%d:%s;", len(k), k, len(id.Bucket[k]), id.Bucket[k])
	}
	return b.String()
}

// newBucket finds the limit of a bucket_id, and the shape it gets when
// nothing is leased for it.
func (s *Server) newBucket(cfg *rlsconfig.Config, domain string, id *rlqspb.BucketId) *bucket {
	b := &bucket{id: id, cfg: cfg}
	deflt := shape{blanket: typev3.RateLimitStrategy_ALLOW_ALL}
	if s.opts.Unmatched == DenyUnmatched {
		deflt.blanket = typev3.RateLimitStrategy_DENY_ALL
	}
	b.sent = deflt
	entries, err := cfg.Order(domain, id.Bucket)
	if err != nil || entries == nil {
		if err != nil {
			s.opts.Logger.Debug("rlqs: bucket_id refused", "domain", domain, "err", err)
		}
		return b
	}
	m, _ := cfg.Lookup(domain, entries)
	l := m.Limit
	switch {
	case l == nil:
		return b
	case l.Unlimited || l.ShadowMode || l.QuotaMode:
		b.sent = shape{blanket: typev3.RateLimitStrategy_ALLOW_ALL}
		return b
	case l.RequestsPerUnit == 0:
		b.sent = shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
		return b
	case s.fixedWindow(l):
		b.sent = shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
		return b
	}
	b.key = rls.BucketKey(domain, entries, m.Values)
	b.rate = float64(l.RequestsPerUnit) / float64(l.Unit.Seconds())
	b.burst = float64(l.Capacity())
	b.sent = shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
	return b
}

// assign books one bucket's usage and returns its next action (nil: none).
func (s *Server) assign(ctx context.Context, st *stream, b *bucket, allowed, denied float64, elapsed time.Duration, now time.Time) (*rlqspb.RateLimitQuotaResponse_BucketAction, error) {
	if allowed+denied == 0 {
		if b.idle.IsZero() {
			b.idle = now
		}
	} else {
		b.idle = time.Time{}
	}
	if b.key == "" { // not divided: the blanket rule, refreshed
		return action(b.id, b.sent, s.opts.TTL), nil
	}
	if !b.idle.IsZero() && now.Sub(b.idle) >= s.opts.AbandonAfter {
		return s.abandon(ctx, st, b, now)
	}
	s.debit(ctx, b, allowed)
	demand := (allowed + denied) / max(elapsed, time.Second).Seconds()
	sh, ttl := s.alloc.Assign(Limit{Key: b.key, Rate: b.rate, Burst: b.burst}, holder(st, b), demand, elapsed, now)
	return action(b.id, sh, ttl), nil
}

// abandon tells Envoy to drop b; what it was assigned stays counted until
// its TTL has passed.
func (s *Server) abandon(ctx context.Context, st *stream, b *bucket, now time.Time) (*rlqspb.RateLimitQuotaResponse_BucketAction, error) {
	s.release(st, b)
	delete(st.buckets, canonical(b.id))
	if m := s.opts.Metrics; m != nil {
		m.abandoned.Inc()
	}
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: b.id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{},
		},
	}, nil
}

// action is the assignment of sh to id for ttl.
func action(id *rlqspb.BucketId, sh shape, ttl time.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	strat := &typev3.RateLimitStrategy{}
	if sh.max == 0 {
		strat.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: sh.blanket}
	} else {
		strat.Strategy = &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens:     sh.max,
			TokensPerFill: wrapperspb.UInt32(sh.perFill),
			FillInterval:  durationpb.New(time.Duration(sh.fill) * time.Second),
		}}
	}
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl),
				RateLimitStrategy:    strat,
			},
		},
	}
}
