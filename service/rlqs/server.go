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
// service.Decide would decide for ShouldRateLimit: rlsconfig.Naming.BucketKey, the
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
// until then). A bucket of any kind reported idle for AbandonAfter is
// abandoned (abandon_action: Envoy drops it and stops reporting it). A
// reload reaches the buckets that keep reporting: each report reads its
// bucket's limit again from a configuration loaded since.
//
// # Bounds
//
// Streams at once (MaxStreams, MaxStreamsPerCaller: ResourceExhausted at
// open). Nothing a report carries ends its stream but its domain, missing
// from the first report or changed (InvalidArgument): Envoy sends every
// bucket it holds in every
// report, so a stream ended for its buckets would end again at each. A
// stream keeps at most MaxBuckets buckets (MaxTracked in all); a new bucket
// past it takes the place of the bucket idle the longest or is abandoned.
// A bucket_id that cannot be read (MaxEntryBytes, MaxIDBytes,
// rls.MaxEntries, empty) is answered as unmatched and not kept; one that is
// not UTF-8, which Go's protobuf refuses to decode and Envoy sends, is
// decoded by Codec and left unanswered (Envoy's parser refuses an answer
// naming it). Reports that may start buckets are a token bucket of
// ReportBurst refilled at ReportRate a second (past it, known buckets are
// answered and new ones abandoned); a bucket is assigned at most once per
// MinServeGap (sooner, its report is booked). At most MaxUsages usages of a
// report are read. Counts are clamped to MaxCount and time_elapsed to
// [0, MaxElapsed]. Every stream's handler ends with its context.
package rlqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// ServiceName is the gRPC service served.
const ServiceName = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"

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
	// Naming names a descriptor's bucket in the store: the rate limit
	// service's (rls.Server.Naming), so that both count one bucket.
	Naming rlsconfig.Naming
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

	opts  Options
	alloc *Allocator

	mu       sync.Mutex
	nextID   uint64
	streams  map[uint64]*stream
	byCaller map[string]int
	closing  bool
	// abandonOnClose: Shutdown abandons the streams' buckets.
	abandonOnClose bool
	bounds         bounds       // of streams and buckets (stream.go)
	tracked        atomic.Int64 // buckets kept by every stream
	// fixedLogged: the fixed-window limits whose DENY_ALL was logged.
	fixedLogged sync.Map
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
	s := &Server{opts: opts, streams: map[uint64]*stream{}, byCaller: map[string]int{}, bounds: defaultBounds,
		alloc: NewAllocator(AllocOptions{TTL: opts.TTL, Grace: opts.Grace, Replicas: opts.Replicas})}
	return s, nil
}

// Register registers s on g: the gRPC door's server (package grpcdoor),
// which authenticates each stream and puts its caller (for the ledger and
// MaxStreamsPerCaller) in the stream's context.
func (s *Server) Register(g *grpc.Server) { rlqspb.RegisterRateLimitQuotaServiceServer(g, s) }

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
	id     *rlqspb.BucketId
	cfg    *rlsconfig.Config // the configuration its limit was read from
	key    string            // the store's bucket key; "" when not divided
	rate   float64
	burst  float64
	sent   shape
	idle   time.Time // since when reported idle; zero: busy
	served time.Time // when an assignment was last sent
}

// assign books one bucket's usage and returns its next action (nil: none).
func (s *Server) assign(ctx context.Context, st *stream, b *bucket, allowed, denied float64, elapsed time.Duration, now time.Time) (*rlqspb.RateLimitQuotaResponse_BucketAction, error) {
	if b.key == "" { // not divided: the blanket rule, refreshed
		return action(b.id, b.sent, s.opts.TTL), nil
	}
	s.debit(ctx, b, allowed)
	demand := (allowed + denied) / max(elapsed, time.Second).Seconds()
	sh, ttl := s.alloc.Assign(Limit{Key: b.key, Rate: b.rate, Burst: b.burst}, holder(st, b), demand, elapsed, now)
	return action(b.id, sh, ttl), nil
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
