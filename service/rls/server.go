// Package rls is the service's second front door: Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC),
// configured by envoyproxy/ratelimit's YAML (package rlsconfig), deciding on
// the service's one store (package service). It translates a request into
// the store's calls and their answers into the response; it never decides:
// token buckets go to service.Decide (all of a request's buckets in one
// atomic decision), fixed windows to Store.Count.
//
// # Decisions
//
// Each descriptor's limit is found as envoyproxy/ratelimit finds it (a
// descriptor's own limit override, unlimited, replaces, shadow_mode,
// quota_mode included), then counted by its algorithm:
//
//   - token_bucket (the default): a bucket of capacity requests_per_unit
//     (or the extension burst) refilled continuously at requests_per_unit per
//     unit, named like a /v1/decide bucket whose key is the descriptor's
//     unambiguous name (rlsconfig.Naming.BucketKey). The buckets of a request
//     are decided together: when one refuses, none is taken from.
//   - fixed_window: envoyproxy/ratelimit's counter of the window (now
//     truncated to the unit), incremented by the hits, over the limit past
//     requests_per_unit, named as it names them (rlsconfig.Naming.WindowKey).
//     Every counter counts, over the limit or not, as there. When an enforced
//     window is over its limit, the request's token buckets are only read.
//   - a calendar limit (rate_limit's calendar, an extension) is a fixed
//     window whose window is the calendar period of its unit in its zone
//     that holds now (calendar.Spec.Window), named by the period's start;
//     its duration_until_reset is the time to the period's end.
//
// Names and the statistics' descriptor labels longer than
// Options.MaxKeyBytes are hashed (rlsconfig.Naming). A request's string that
// is not valid UTF-8 is read in a stated form and decided (decode.go).
//
// requests_per_unit 0 is counted as a fixed window whatever the algorithm (a
// bucket of capacity 0 would never refill): every hit is over the limit.
//
// # What envoyproxy/ratelimit adds on request
//
// As its settings of the same meaning do: Options.Headers puts the limit
// closest to refusing in response_headers_to_add (ResponseHeaders, its
// LIMIT_RESPONSE_HEADERS_ENABLED), Options.Metadata the request as decided
// in dynamic_metadata (metadata.go, its RESPONSE_DYNAMIC_METADATA),
// Options.NearLimitRatio sets the near-limit threshold (its
// NEAR_LIMIT_RATIO), and Metrics.WithPeerSeries counts its Prometheus
// series (PeerSeries, its USE_PROMETHEUS) beside limitd's own.
//
// # Errors
//
// A request without a domain or descriptors, or beyond the bounds (MaxDescriptors, MaxEntries, hits_addend
// above 2^32-1, an override with an unknown unit) is InvalidArgument; a store
// failure or timeout is Unavailable, so Envoy's failure_mode_deny decides.
package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// Bounds of a request, beyond the gRPC message size.
const (
	// MaxDescriptors bounds the descriptors of one request.
	MaxDescriptors = 64
	// MaxEntries bounds the entries of one descriptor.
	MaxEntries = rlsconfig.MaxEntries
)

// NearLimitRatio is the share of a limit past which hits count as near the
// limit (envoyproxy/ratelimit's NEAR_LIMIT_RATIO default): the default of
// Options.NearLimitRatio.
const NearLimitRatio = 0.8

// Options configure a Server. Store is required.
type Options struct {
	// Store takes the decisions (the HTTP API's store).
	Store service.Store
	// Algorithm counts every limit that names none (default TokenBucket).
	Algorithm rlsconfig.Algorithm
	// WindowKeyPrefix starts every fixed-window counter's name
	// (envoyproxy/ratelimit's CACHE_KEY_PREFIX; default none, its default).
	WindowKeyPrefix string
	// MaxKeyBytes bounds the names of buckets, counters and the statistics'
	// descriptor labels; a longer one is hashed (rlsconfig.Naming; default
	// rlsconfig.DefaultMaxKeyBytes, limitd's --max-key-bytes).
	MaxKeyBytes int
	// Timeout bounds each call (default service.DefaultTimeout).
	Timeout time.Duration
	// Now is the clock of fixed windows (default time.Now), as
	// envoyproxy/ratelimit reads its own clock to name a window.
	Now func() time.Time
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
	// Metrics receives the statistics (required: NewMetrics).
	Metrics *Metrics
	// Headers, when set, adds to every answer with a limit the three
	// headers envoyproxy/ratelimit adds with LIMIT_RESPONSE_HEADERS_ENABLED
	// (ResponseHeaders).
	Headers *ResponseHeaders
	// Metadata, when set, adds to every answer the dynamic metadata
	// envoyproxy/ratelimit adds with RESPONSE_DYNAMIC_METADATA (see
	// dynamicMetadata in metadata.go).
	Metadata bool
	// NearLimitRatio is the share of a limit past which hits count as near
	// it, in float32 as envoyproxy/ratelimit's NEAR_LIMIT_RATIO: the
	// threshold is floor(float32(limit) × ratio). 0 means NearLimitRatio;
	// otherwise it must be within (0, 1].
	NearLimitRatio float32
}

// Server implements pb.RateLimitServiceServer.
type Server struct {
	pb.UnimplementedRateLimitServiceServer

	store   service.Store
	algo    rlsconfig.Algorithm
	names   rlsconfig.Naming
	timeout time.Duration
	now     func() time.Time
	log     *slog.Logger
	metrics *Metrics
	near    float32
	headers *ResponseHeaders
	meta    bool
	config  atomic.Pointer[rlsconfig.Config]
}

// NewServer returns a Server for opts, with no configuration: it answers
// Unavailable until SetConfig.
func NewServer(opts Options) (*Server, error) {
	if opts.Store == nil {
		return nil, errors.New("rls: options: store: required")
	}
	if opts.Metrics == nil {
		return nil, errors.New("rls: options: metrics: required")
	}
	if opts.Algorithm == rlsconfig.Default {
		opts.Algorithm = rlsconfig.TokenBucket
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
	switch r := opts.NearLimitRatio; {
	case r == 0:
		opts.NearLimitRatio = NearLimitRatio
	case !(r > 0 && r <= 1):
		return nil, fmt.Errorf("rls: options: near limit ratio: want within (0, 1], got %v", r)
	}
	return &Server{
		store: opts.Store, algo: opts.Algorithm, timeout: opts.Timeout,
		names: rlsconfig.Naming{MaxKeyBytes: opts.MaxKeyBytes, WindowPrefix: opts.WindowKeyPrefix},
		now:   opts.Now, log: opts.Logger, metrics: opts.Metrics, near: opts.NearLimitRatio,
		headers: opts.Headers, meta: opts.Metadata,
	}, nil
}

// SetConfig makes c the configuration of the calls that start from now on.
func (s *Server) SetConfig(c *rlsconfig.Config) { s.config.Store(c) }

// Config is the configuration in use (nil before SetConfig).
func (s *Server) Config() *rlsconfig.Config { return s.config.Load() }

// Naming is how s names the counters of descriptors in the store: the quota
// service names them the same way (rlqs.Options.Naming), so both doors count
// one bucket for a descriptor.
func (s *Server) Naming() rlsconfig.Naming { return s.names }

// descriptor is one descriptor of a request as it is counted.
type descriptor struct {
	entries   []rlsconfig.Entry
	hits      uint64
	limit     *rlsconfig.RateLimit // nil: no limit (none matched, replaced, or unlimited)
	values    []string
	unlimited bool
	algo      rlsconfig.Algorithm
	index     int // into the bucket request or the window request
	// what the store answered
	over      bool // over the limit by its own count
	remaining uint64
	reset     time.Duration
	before    uint64 // fixed window: the count before the hits
	after     uint64 // fixed window: the count after them
}

// ShouldRateLimit implements pb.RateLimitServiceServer.
func (s *Server) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if p := s.metrics.peer; p != nil {
		defer func(start time.Time) { p.call(time.Since(start)) }(time.Now())
	}
	cfg := s.config.Load()
	if cfg == nil {
		if p := s.metrics.peer; p != nil {
			p.errored("service_error") // as the peer counts its "no rate limit configuration loaded"
		}
		return nil, status.Error(codes.Unavailable, "rls: no configuration loaded")
	}
	ds, err := s.translate(cfg, req)
	if err != nil {
		s.metrics.invalid.Inc()
		if p := s.metrics.peer; p != nil {
			p.errored("service_error")
		}
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.count(ctx, req.Domain, ds); err != nil {
		s.metrics.storeErrors.Inc()
		if p := s.metrics.peer; p != nil {
			p.errored("redis_error")
		}
		if n, ok := s.metrics.errLog.Allow(time.Now()); ok {
			s.log.Warn("rate limit service: store failed", "err", err, "suppressed", n)
		}
		return nil, status.Error(codes.Unavailable, "rls: store: "+err.Error())
	}
	return s.answer(req, ds), nil
}

// translate finds each descriptor's limit and hits, as envoyproxy/ratelimit
// does, and checks the request's bounds.
func (s *Server) translate(cfg *rlsconfig.Config, req *pb.RateLimitRequest) ([]descriptor, error) {
	switch {
	case req.GetDomain() == "":
		return nil, errors.New("rls: domain: must not be empty")
	case len(req.GetDescriptors()) == 0:
		return nil, errors.New("rls: descriptors: must not be empty")
	case len(req.Descriptors) > MaxDescriptors:
		return nil, fmt.Errorf("rls: descriptors: at most %d, got %d", MaxDescriptors, len(req.Descriptors))
	}
	ds := make([]descriptor, len(req.Descriptors))
	replacing := map[string]bool{}
	for i, pd := range req.Descriptors {
		d := &ds[i]
		if len(pd.Entries) > MaxEntries {
			return nil, fmt.Errorf("rls: descriptors[%d].entries: at most %d, got %d", i, MaxEntries, len(pd.Entries))
		}
		d.entries = make([]rlsconfig.Entry, len(pd.Entries))
		for j, e := range pd.Entries {
			d.entries[j] = rlsconfig.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		if h := pd.GetHitsAddend(); h != nil {
			d.hits = h.GetValue()
			if d.hits > service.MaxWindowHits {
				return nil, fmt.Errorf("rls: descriptors[%d].hits_addend: at most %d, got %d", i, uint64(service.MaxWindowHits), d.hits)
			}
		} else {
			d.hits = max(1, uint64(req.GetHitsAddend()))
		}
		m, known := cfg.Lookup(req.Domain, d.entries)
		if known && pd.GetLimit() != nil {
			unit := rlsconfig.Unit(pd.Limit.GetUnit())
			if unit.Seconds() == 0 {
				return nil, fmt.Errorf("rls: descriptors[%d].limit.unit: unknown unit %s", i, pd.Limit.GetUnit())
			}
			m.Limit = &rlsconfig.RateLimit{RequestsPerUnit: pd.Limit.GetRequestsPerUnit(), Unit: unit,
				Key: rlsconfig.OverrideKey(req.Domain, d.entries)}
			m.Values = make([]string, len(d.entries))
			for j, e := range d.entries {
				m.Values[j] = e.Value
			}
		}
		d.limit, d.values = m.Limit, m.Values
		if d.limit != nil {
			d.limit.Key = s.names.Label(d.limit.Key) // d.limit is the lookup's copy
			for _, r := range d.limit.Replaces {
				replacing[r] = true
			}
			if d.limit.Unlimited {
				d.unlimited, d.limit = true, nil
			}
		}
	}
	for i := range ds {
		d := &ds[i]
		if d.limit != nil && d.limit.Name != "" && replacing[d.limit.Name] {
			d.limit = nil
		}
		if d.limit == nil {
			continue
		}
		d.algo = d.limit.Algorithm
		switch {
		case d.algo != rlsconfig.Default:
		case d.limit.Burst > 0: // a burst is a token bucket's, whatever the service's default
			d.algo = rlsconfig.TokenBucket
		default:
			d.algo = s.algo
		}
		if d.limit.RequestsPerUnit == 0 {
			d.algo = rlsconfig.FixedWindow
		}
	}
	return ds, nil
}

// enforced reports whether a descriptor over its limit refuses the request.
func (d *descriptor) enforced() bool { return !d.limit.ShadowMode && !d.limit.QuotaMode }

// count asks the store: the fixed windows first (they count whatever
// happens), then the token buckets in one decision, only read when an
// enforced window is over its limit.
func (s *Server) count(ctx context.Context, domain string, ds []descriptor) error {
	wreq, breq := s.storeRequests(domain, ds)
	refused := false
	if len(wreq.Windows) > 0 {
		var err error
		if refused, err = s.countWindows(ctx, wreq, ds); err != nil {
			return err
		}
	}
	if len(breq.Buckets) == 0 {
		return nil
	}
	return s.decideBuckets(ctx, breq, ds, refused)
}

// calendarMargin is how long, in seconds, a calendar window's counter
// outlives the window's end: a limitd whose clock lags by less still counts
// in it.
const calendarMargin = 60

// storeRequests builds the store's requests of ds: a counter per fixed
// window, a bucket per token bucket (the same bucket twice is one bucket of
// both costs), each descriptor's index into its request set.
func (s *Server) storeRequests(domain string, ds []descriptor) (*service.CountRequest, *wire.Request) {
	var wreq service.CountRequest
	var breq wire.Request
	var now time.Time
	for i := range ds {
		d := &ds[i]
		if d.limit == nil {
			continue
		}
		if d.algo == rlsconfig.FixedWindow {
			if now.IsZero() {
				now = s.now()
			}
			div := d.limit.Unit.Seconds()
			d.index = len(wreq.Windows)
			if cal := d.limit.Calendar; cal != nil {
				// A calendar window: named by its start, kept to its end
				// plus calendarMargin, reset at its end.
				from, to := cal.Window(now)
				wreq.Windows = append(wreq.Windows, service.Window{
					Key:    s.names.WindowKey(domain, d.entries, d.values, from.Unix()),
					Hits:   d.hits,
					Expiry: to.Unix() - now.Unix() + calendarMargin,
				})
				d.reset = to.Sub(now)
				continue
			}
			wreq.Windows = append(wreq.Windows, service.Window{
				Key:    s.names.WindowKey(domain, d.entries, d.values, now.Unix()/div*div),
				Hits:   d.hits,
				Expiry: div,
			})
			d.reset = time.Duration(div-now.Unix()%div) * time.Second
			continue
		}
		rate := float64(d.limit.RequestsPerUnit) / float64(d.limit.Unit.Seconds())
		key := s.names.BucketKey(domain, d.entries, d.values)
		b := wire.Bucket{Key: key, Rate: rate, Burst: float64(d.limit.Capacity()), Cost: float64(d.hits), Shadow: !d.enforced()}
		d.index = -1
		for j := range breq.Buckets {
			if o := &breq.Buckets[j]; o.Key == b.Key && o.Rate == b.Rate && o.Burst == b.Burst && o.Shadow == b.Shadow {
				o.Cost += b.Cost
				d.index = j
			}
		}
		if d.index < 0 {
			d.index = len(breq.Buckets)
			breq.Buckets = append(breq.Buckets, b)
		}
	}
	return &wreq, &breq
}

// countWindows increments the fixed windows' counters and reads the
// answers into ds; refused reports an enforced window over its limit.
func (s *Server) countWindows(ctx context.Context, wreq *service.CountRequest, ds []descriptor) (refused bool, err error) {
	a, err := s.store.Count(ctx, wreq)
	if err != nil {
		return false, err
	}
	for i := range ds {
		d := &ds[i]
		if d.limit == nil || d.algo != rlsconfig.FixedWindow {
			continue
		}
		d.after = a.Counts[d.index]
		d.before = d.after - min(d.after, d.hits)
		limit := uint64(d.limit.RequestsPerUnit)
		d.over = d.after > limit
		if !d.over {
			d.remaining = limit - d.after
		}
		refused = refused || (d.over && d.enforced())
	}
	return refused, nil
}

// decideBuckets decides the token buckets in one decision (costs 0 when
// refused: only read) and reads the answers into ds.
func (s *Server) decideBuckets(ctx context.Context, breq *wire.Request, ds []descriptor, refused bool) error {
	if refused {
		for j := range breq.Buckets {
			breq.Buckets[j].Cost = 0
		}
	}
	a, shadowErrs, err := service.Decide(ctx, s.store, breq)
	if err != nil {
		return err
	}
	s.metrics.shadowErrors.Add(float64(shadowErrs))
	for i := range ds {
		d := &ds[i]
		if d.limit == nil || d.algo == rlsconfig.FixedWindow {
			continue
		}
		ba := &a.Buckets[d.index]
		d.over = !ba.Allowed
		d.remaining = uint64(max(0, ba.Remaining))
		d.reset = time.Duration(ba.ResetMs) * time.Millisecond
	}
	return nil
}

// answer builds the response and counts the statistics.
func (s *Server) answer(req *pb.RateLimitRequest, ds []descriptor) *pb.RateLimitResponse {
	domain := req.Domain
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(ds))}
	closest, closestRemaining := -1, uint64(math.MaxUint32) // the descriptor the headers report
	for i := range ds {
		d := &ds[i]
		switch {
		case d.unlimited:
			resp.Statuses[i] = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
			continue
		case d.limit == nil:
			resp.Statuses[i] = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
			continue
		}
		st := &pb.RateLimitResponse_DescriptorStatus{
			Code: pb.RateLimitResponse_OK,
			CurrentLimit: &pb.RateLimitResponse_RateLimit{
				Name: d.limit.Name, RequestsPerUnit: d.limit.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(d.limit.Unit.Envoy()),
			},
			LimitRemaining:     uint32(min(d.remaining, math.MaxUint32)),
			DurationUntilReset: durationpb.New(d.reset),
		}
		s.metrics.record(domain, d, s.near)
		if rem := min(d.remaining, math.MaxUint32); rem < closestRemaining || d.over && d.enforced() {
			closest, closestRemaining = i, min(rem, closestRemaining)
		}
		if d.over {
			switch {
			case d.limit.QuotaMode:
				st.DurationUntilReset = nil
			case d.limit.ShadowMode:
			default:
				st.Code = pb.RateLimitResponse_OVER_LIMIT
				resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
			}
		}
		resp.Statuses[i] = st
	}
	if s.headers != nil && closest >= 0 {
		resp.ResponseHeadersToAdd = s.headers.of(&ds[closest])
	}
	if s.meta {
		resp.DynamicMetadata = dynamicMetadata(req, ds)
	}
	return resp
}
