// Package rlqs is the service's third front door: Envoy's rate limit quota
// service (envoy.service.rate_limit_quota.v3.RateLimitQuotaService, one
// bidirectional stream per Envoy of usage reports and quota assignments),
// served by Envoy's own rate_limit_quota filter. Its limits are the rate
// limit service's (package rlsconfig, the same --rls-config YAML), and each
// assignment is carved from the same global bucket in the store as
// ShouldRateLimit's and /v1/lease's through the lease ledger, so the fleet
// never admits more than burst + rate × t.
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
// is ALLOW_ALL; a limit of 0, or a fixed_window limit (it is a counter, not
// a bucket that can be leased), DENY_ALL.
//
// # Assignments
//
// For each bucket of a report, the stream's share of the limit's rate is
// its reported demand's fair fraction (shares.go) and the same fraction of
// the burst left after the rates' life and a reserve for new Envoys
// ((burst − rate × (TTL + Grace)) × (1 − Reserve)). It is
// sent as a token_bucket (max_tokens, tokens_per_fill per whole-second
// fill_interval, as Envoy 1.40 reads it: its rate is tokens_per_fill over
// the interval truncated to seconds) with assignment_time_to_live TTL. What
// Envoy can admit under it from the report on is at most max_tokens plus the
// rate over TTL + Grace (Grace covers the report's and the assignment's way
// over the stream), plus, when the shape changes (Envoy then starts a new,
// full bucket), what the old one could still admit before the new one
// arrives (its max_tokens plus its rate over Grace). The stream holds that
// much, leased from the global bucket (service.Store.Lease, under the
// caller's name) and debited by every reported allowed request: at each
// report it leases what it lacks or returns what it holds beyond it. When
// the global bucket cannot give what is lacking, the shape is shrunk to what
// is held, down to DENY_ALL. A shape within 15% of the last one sent is
// sent again unchanged, so Envoy keeps its bucket and its tokens.
//
// A stream's end returns only what it holds beyond what Envoy could still
// admit (Envoy keeps its assignments until their TTL): what an Envoy that
// vanished held comes back to the fleet through the global bucket's refill.
// A bucket of any kind reported idle for AbandonAfter is abandoned
// (abandon_action: Envoy drops it and stops reporting it) and what it held
// beyond its residue returned.
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
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// ServiceName is the gRPC service served.
const ServiceName = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"

// Reserve is the part of a limit's burst no stream's max_tokens is sized
// from, so that a new Envoy gets tokens at its first report while the
// others' shares still hold the rest.
const Reserve = 0.125

// MaxFill is the longest fill_interval, in seconds, of the intervals tried
// to express a rate below MaxFill a second as tokens_per_fill over a whole
// number of seconds (Envoy truncates the interval to seconds).
const MaxFill = 60

// Defaults of Options.
const (
	// DefaultTTL is an assignment's longest life.
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
	// Store leases the assignments (the HTTP API's and ShouldRateLimit's).
	Store service.Store
	// Config returns the configuration in use (the rate limit service's:
	// rls.Server.Config); nil means none yet (streams get Unavailable).
	Config func() *rlsconfig.Config
	// Unmatched is the answer to a bucket that matches no limit.
	Unmatched Unmatched
	// TTL is an assignment's longest life (DefaultTTL), in whole seconds;
	// it is shortened for a limit whose rate over it would tie up more than
	// a quarter of the burst, never below twice the reporting interval or a
	// second.
	TTL time.Duration
	// Grace (DefaultGrace) is covered by every lease beyond the TTL.
	Grace time.Duration
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
	shares *shares

	mu       sync.Mutex
	nextID   uint64
	streams  map[uint64]*stream
	byCaller map[string]int
	closing  bool
	// abandonOnClose: Shutdown abandons the streams' buckets.
	abandonOnClose bool
	bounds         bounds       // of streams and buckets (stream.go)
	tracked        atomic.Int64 // buckets kept by every stream
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
	s := &Server{opts: opts, shares: newShares(), streams: map[uint64]*stream{}, byCaller: map[string]int{}, bounds: defaultBounds}
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

// bucket is one bucket of a stream.
type bucket struct {
	id      *rlqspb.BucketId
	key     string // the store's bucket key; "" when not leased
	rate    float64
	burst   float64
	held    float64 // leased and not yet returned nor spent
	ent     float64 // what it may still lease: its share of the refill
	entAt   time.Time
	frac    float64 // its share at the last report
	sent    shape
	hasSent bool
	expiry  time.Time // the sent assignment's end, with grace
	idle    time.Time // since when reported idle; zero: busy
	served  time.Time // when an assignment was last sent
}

// residue is the most Envoy can still admit under b's last assignment from
// now on: its full bucket and its rate to the assignment's end.
func (s *Server) residue(b *bucket, now time.Time) float64 {
	if !b.hasSent || !now.Before(b.expiry) {
		return 0
	}
	return b.sent.most(b.expiry.Sub(now))
}

// lease asks b's global bucket for want (at least 0) after returning ret,
// and books the answer in b.held: what it granted and what it took back.
func (s *Server) lease(ctx context.Context, b *bucket, want, ret float64) (float64, error) {
	want, ret = math.Min(want, b.burst), math.Min(ret, b.burst) // the store's bounds
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	a, err := s.opts.Store.Lease(ctx, &wire.LeaseRequest{Buckets: []wire.LeaseBucket{{
		Key: b.key, Rate: b.rate, Burst: b.burst, Want: want, Return: ret,
	}}})
	m := s.opts.Metrics
	if m != nil {
		m.storeCalls.Inc()
	}
	if err != nil {
		if m != nil {
			m.storeErrs.Inc()
		}
		return 0, err
	}
	g := a.Buckets[0]
	if m != nil {
		m.leased.Add(g.Tokens)
		m.returned.Add(g.Returned)
	}
	b.held += g.Tokens - g.Returned
	if b.held < 0 {
		b.held = 0
	}
	return g.Tokens, nil
}

// ttl is the life of b's assignments: Options.TTL, shortened so that the
// rate over it ties up at most a quarter of the burst, never below twice
// the reporting interval (up to MaxTTL) nor a second.
func (s *Server) ttl(b *bucket, interval time.Duration) time.Duration {
	ttl := s.opts.TTL
	if b.rate > 0 {
		fit := time.Duration((b.burst/4/b.rate)*float64(time.Second)) - s.opts.Grace
		ttl = min(ttl, fit)
	}
	ttl = max(ttl, min(2*interval, MaxTTL), time.Second)
	return ttl.Truncate(time.Second)
}

// assign books one bucket's usage and returns its next action (nil: none).
func (s *Server) assign(ctx context.Context, st *stream, b *bucket, allowed, denied float64, elapsed time.Duration, now time.Time) (*rlqspb.RateLimitQuotaResponse_BucketAction, error) {
	if b.key == "" { // not leased: the blanket rule, refreshed
		ttl := s.opts.TTL
		b.hasSent, b.expiry = true, now.Add(ttl+s.opts.Grace)
		return action(b.id, b.sent, ttl), nil
	}
	b.held = math.Max(0, b.held-allowed)
	interval := max(elapsed, time.Second)
	ttl := s.ttl(b, elapsed)
	life := ttl + s.opts.Grace
	d := (allowed + denied) / interval.Seconds()
	frac := s.shares.set(b.key, st.id, st.caller, d, b.rate, now, 2*life+interval)

	// The old assignment's residue while the new one is on its way: none
	// when Envoy keeps its bucket (the same shape, still in force).
	changedResidue := 0.0
	if b.hasSent && now.Before(b.expiry) {
		changedResidue = math.Min(b.held, b.sent.most(s.opts.Grace))
	}
	// The stream may lease its share of the global bucket's refill since
	// its last report (up to its share of the burst), and what its share
	// of the burst grew by: under overload, the first to report would
	// otherwise take every token refilled.
	if b.entAt.IsZero() {
		b.ent = frac * b.burst
	} else if d := now.Sub(b.entAt); d > 0 {
		b.ent += frac*b.rate*d.Seconds() + max(0, frac-b.frac)*b.burst
	}
	b.ent = math.Min(b.ent, frac*b.burst)
	b.entAt, b.frac = now, frac
	want := s.fit(b.rate*frac, (b.burst-b.rate*life.Seconds())*(1-Reserve)*frac)
	keep := b.hasSent && b.sent.max > 0 && now.Before(b.expiry) && near(want, b.sent)
	if keep {
		want = b.sent
	}
	target := want.most(life)
	if !keep {
		target += changedResidue
	}
	var err error
	switch {
	case b.held < target && b.ent > 0:
		var got float64
		got, err = s.lease(ctx, b, math.Min(target-b.held, b.ent), 0)
		b.ent -= got
	case b.held > target:
		_, err = s.lease(ctx, b, 0, b.held-target)
	}
	if err != nil {
		// The store failed: nothing was leased or returned as far as is
		// known, and the assignment in force stands until its TTL.
		s.opts.Logger.Warn("rlqs: store", "key", b.key, "err", err)
		return nil, nil
	}
	inForce := b.hasSent && b.sent.max > 0 && now.Before(b.expiry)
	switch {
	case b.held >= target:
	case !keep && inForce && want.max >= b.sent.max && b.sent.most(life) <= b.held:
		// Growing, and what the new shape and the old one's residue
		// need is not held yet: the part of it that fits, when its rate
		// (or, at the same rate, its max_tokens) is above the old one's;
		// else the old shape goes on (Envoy keeps its bucket). What was
		// leased stays held for the next report.
		c := s.shrink(want, b.held-changedResidue, life)
		if c.rate() < b.sent.rate() || (c.rate() == b.sent.rate() && c.max <= b.sent.max) {
			c = b.sent
		}
		want = c
	default: // the global bucket is short: shrink to what is held
		want = s.shrink(want, b.held-changedResidue, life)
	}
	if inForce {
		want = distinct(want, b.sent)
	}
	b.sent, b.hasSent, b.expiry = want, true, now.Add(life)
	return action(b.id, want, ttl), nil
}

// fit is the token bucket nearest below a rate (tokens a second) and a
// burst: tokens_per_fill over a whole-second fill_interval at most rate, and
// max_tokens at most burst but at least 1 (DENY_ALL when no token fits).
func (s *Server) fit(rate, burst float64) shape {
	deny := shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
	if math.IsNaN(rate) || math.IsNaN(burst) || rate <= 0 {
		return deny
	}
	sh := shape{max: uint32(math.Min(math.Max(math.Floor(burst), 1), math.MaxUint32))}
	switch {
	case rate >= MaxFill:
		sh.perFill, sh.fill = uint32(math.Min(math.Floor(rate), math.MaxUint32)), 1
	case rate*MaxFill < 1:
		sh.perFill, sh.fill = 1, int64(math.Min(math.Ceil(1/rate), 86400))
	default: // the nearest rate at most rate, over intervals of 1 to MaxFill s
		best := 0.0
		for f := int64(1); f <= MaxFill; f++ {
			if n := math.Floor(rate * float64(f)); n >= 1 && n/float64(f) > best {
				best, sh.perFill, sh.fill = n/float64(f), uint32(n), f
			}
		}
	}
	return sh
}

// shrink fits sh into avail: what Envoy can admit under it over life at
// most avail. The rate goes first (steady traffic flows at it), max_tokens
// takes what is left; when even the rate does not fit it is lowered, and
// when no token fits, DENY_ALL.
func (s *Server) shrink(sh shape, avail float64, life time.Duration) shape {
	deny := shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
	if sh.max == 0 || avail < 1 {
		return deny
	}
	r := math.Min(sh.rate(), (avail-1)/life.Seconds())
	for range 16 {
		c := s.fit(r, math.Min(float64(sh.max), avail-r*life.Seconds()))
		if c.max == 0 {
			break
		}
		if c.most(life) <= avail {
			return c
		}
		r *= 0.9
	}
	return deny
}

// distinct returns sh as Envoy will see it beside old, the shape in force:
// Envoy 1.40 keeps its bucket (and its rate) when max_tokens,
// tokens_per_fill and fill_interval's nanos are equal, so a shape that
// differs from old only in fill_interval's whole seconds would leave it on
// the old rate. Such a shape is sent with one token fewer, or, at one
// token, with tokens_per_fill and fill_interval doubled (the same rate).
// The old bucket's residue is held as for any change.
func distinct(sh, old shape) shape {
	if sh.max == 0 || old.max == 0 || sh == old || sh.max != old.max || sh.perFill != old.perFill {
		return sh
	}
	if sh.max > 1 {
		sh.max--
		return sh
	}
	if sh.perFill > 1<<30 { // doubling would overflow: a token a fill fewer
		sh.perFill--
		return sh
	}
	sh.perFill, sh.fill = sh.perFill*2, sh.fill*2
	return sh
}

// near reports whether a is within 15% of b in rate and max_tokens.
func near(a, b shape) bool {
	if a.max == 0 || b.max == 0 {
		return false
	}
	within := func(x, y float64) bool { return x >= 0.85*y && x <= 1.15*y }
	return within(float64(a.max), float64(b.max)) && within(a.rate(), b.rate())
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
