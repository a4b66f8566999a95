package rlqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// Bounds of what a client sends. A stream is ended (InvalidArgument) only
// for a report without a domain or with another domain than its first; the
// other bounds are met by answering, never by ending the stream: Envoy 1.40
// sends every bucket it holds in every report, so a stream ended for its
// buckets would be ended again at each report and its Envoy cut off its
// quota.
const (
	// MaxStreams bounds the streams open at once (ResourceExhausted past
	// it): one stream per Envoy.
	MaxStreams = 2048
	// MaxStreamsPerCaller bounds the streams of one caller (token name),
	// ResourceExhausted past it: with one token shared by a fleet, the
	// simple set-up, it is the most Envoys one limitd serves.
	MaxStreamsPerCaller = 1024
	// MaxBuckets bounds the buckets one stream keeps. A new bucket past
	// it takes the place of the bucket reported idle the longest (which
	// is abandoned); when none is idle, it is abandoned at once (Envoy
	// applies its no_assignment_behavior to its requests and reports it
	// again at its next request).
	MaxBuckets = 512
	// MaxTracked bounds the buckets kept by all streams together, and
	// MaxStreamIDBytes the bytes of the bucket_ids one stream keeps, both
	// met as MaxBuckets is. Envoy reports the buckets kept and those made
	// since its last answer, so MaxStreamIDBytes keeps its reports within
	// the gRPC server's default message bound (grpcdoor.DefaultMaxRecvBytes,
	// 64 KiB, with about 30 bytes a usage beside its bucket_id).
	MaxTracked       = 1 << 16
	MaxStreamIDBytes = 40 << 10
	// MaxUsages bounds the bucket usages of one report that are read; the
	// rest of the report is left unanswered.
	MaxUsages = 4 * MaxBuckets
	// MaxEntryBytes bounds a bucket_id key or value, and MaxIDBytes all of
	// a bucket_id's keys and values: a bucket_id beyond them (or with more
	// than rlsconfig.MaxEntries entries, or bytes that are not UTF-8) cannot be
	// read and is answered untracked as unmatched (Options.Unmatched).
	MaxEntryBytes = 256
	MaxIDBytes    = 512
	// MaxDomainBytes bounds the domain.
	MaxDomainBytes = 256
	// MaxCount clamps a report's allowed or denied count.
	MaxCount = 1 << 32
	// MaxElapsed clamps a report's time_elapsed.
	MaxElapsed = time.Hour
	// MaxTTL bounds the life a long reporting interval gives assignments.
	MaxTTL = 5 * time.Minute
	// ReportBurst and ReportRate bound the reports of one stream that may
	// start buckets: a token bucket of ReportBurst reports refilled at
	// ReportRate a second (Envoy sends one per reporting interval and one
	// per new bucket). A report past it is still read: its known buckets
	// are answered, its new ones abandoned (Envoy reports them again at
	// their next request).
	ReportBurst = 256
	ReportRate  = 10
	// MinServeGap is the least time between two assignments of one bucket:
	// a bucket reported again sooner (a flood of reports) is booked, not
	// answered, so that a stream makes at most one store call a bucket in
	// that time.
	MinServeGap = time.Second
)

// bounds are the bounds a Server applies (the constants; tests lower them).
type bounds struct {
	streams, perCaller, buckets, tracked, idBytes int
}

var defaultBounds = bounds{streams: MaxStreams, perCaller: MaxStreamsPerCaller, buckets: MaxBuckets, tracked: MaxTracked,
	idBytes: MaxStreamIDBytes}

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
	idBytes int                // of the buckets' bucket_ids (MaxStreamIDBytes)
	last    time.Time          // when reports was last refilled
}

// StreamRateLimitQuotas serves one Envoy.
func (s *Server) StreamRateLimitQuotas(srv rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	caller, ok := service.CallerFrom(srv.Context())
	if !ok {
		return s.opts.Metrics.refuse(status.Error(codes.Unauthenticated, "rlqs: authorization: no caller (serve it on the gRPC door)"))
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
		case <-srv.Context().Done(): // the client left: the reader may be gone
			return status.FromContextError(srv.Context().Err()).Err()
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
	case len(s.streams) >= s.bounds.streams:
		return nil, status.Errorf(codes.ResourceExhausted, "rlqs: streams: at most %d open at once", s.bounds.streams)
	case s.byCaller[caller] >= s.bounds.perCaller:
		return nil, status.Errorf(codes.ResourceExhausted, "rlqs: streams: at most %d open at once per caller", s.bounds.perCaller)
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

// close ends st: its demands leave the shares; what its buckets were
// assigned stays counted until its TTL (Allocator.Release).
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
	s.tracked.Add(-int64(len(st.buckets)))
	for _, b := range st.buckets {
		s.release(st, b)
	}
}

// report handles one usage report and returns the assignments to send.
// Nothing Envoy reports ends the stream but a missing or changed domain:
// a bucket past the bounds or that cannot be read is answered without being
// kept (untracked), and a report past the report budget is booked (what its
// known buckets allowed is debited) without store calls for new buckets.
func (s *Server) report(st *stream, msg *rlqspb.RateLimitQuotaUsageReports) (*rlqspb.RateLimitQuotaResponse, error) {
	now := s.opts.Now()
	m := s.opts.Metrics
	if m != nil {
		m.reports.Inc()
	}
	if err := s.checkReport(st, msg); err != nil {
		return nil, err
	}
	cfg := s.opts.Config()
	if cfg == nil {
		return nil, status.Error(codes.Unavailable, "rlqs: no configuration loaded yet")
	}
	budget := st.admitReport(now)
	if !budget && m != nil {
		m.overBudget.Inc()
	}
	ctx := service.WithCaller(st.srv.Context(), st.caller)
	resp := &rlqspb.RateLimitQuotaResponse{}
	for i, u := range msg.BucketQuotaUsages {
		if i >= MaxUsages {
			if m != nil {
				m.untracked.WithLabelValues("past_max_usages").Add(float64(len(msg.BucketQuotaUsages) - i))
			}
			break
		}
		if err := s.usage(ctx, cfg, st, u, budget, now, resp); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// usage handles one bucket's part of a report, appending its actions (none,
// one, or an eviction's abandon and the bucket's own) to resp.
func (s *Server) usage(ctx context.Context, cfg *rlsconfig.Config, st *stream, u *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage,
	budget bool, now time.Time, resp *rlqspb.RateLimitQuotaResponse,
) error {
	allowed := float64(min(u.GetNumRequestsAllowed(), MaxCount))
	denied := float64(min(u.GetNumRequestsDenied(), MaxCount))
	elapsed := min(max(u.GetTimeElapsed().AsDuration(), 0), MaxElapsed)
	busy := allowed+denied > 0
	add := func(a *rlqspb.RateLimitQuotaResponse_BucketAction) {
		if a != nil {
			resp.BucketAction = append(resp.BucketAction, a)
		}
	}
	if why := unreadable(u.GetBucketId()); why != "" {
		s.opts.Logger.Debug("rlqs: bucket_id unreadable", "domain", st.domain, "why", why)
		if why == "utf8" {
			// Envoy 1.40 refuses an answer naming it (its parser checks
			// UTF-8 and ends the stream): left unanswered, the bucket
			// stays under no_assignment_behavior.
			if m := s.opts.Metrics; m != nil {
				m.untracked.WithLabelValues(why).Inc()
			}
			return nil
		}
		add(s.untracked(u.GetBucketId(), s.unmatched(), busy, why))
		return nil
	}
	id := canonical(u.BucketId)
	b := st.buckets[id]
	if b == nil {
		// A bucket not kept is abandoned, idle or not: Envoy then holds
		// only the buckets kept and those made since its last answer, so
		// its reports stay within the gRPC door's message bound.
		switch {
		case !budget:
			add(s.untracked(u.BucketId, shape{}, false, "over_budget"))
			return nil
		case !s.room(ctx, st, u.BucketId, now, add):
			add(s.untracked(u.BucketId, shape{}, false, "max_buckets"))
			return nil
		}
		b = s.newBucket(cfg, st.domain, u.BucketId)
		st.buckets[id] = b
	} else if b.cfg != cfg { // a reload reaches a bucket that keeps reporting
		b = s.refresh(st, b, cfg)
		st.buckets[id] = b
	}
	if busy {
		b.idle = time.Time{}
	} else if b.idle.IsZero() {
		b.idle = now
	}
	if !b.idle.IsZero() && now.Sub(b.idle) >= s.opts.AbandonAfter {
		add(s.abandon(st, b))
		return nil
	}
	if !b.served.IsZero() && now.Sub(b.served) < MinServeGap {
		// Served a moment ago (a report flood): booked only.
		s.debit(ctx, b, allowed)
		return nil
	}
	act, err := s.assign(ctx, st, b, allowed, denied, elapsed, now)
	if err != nil {
		return err
	}
	if act != nil {
		b.served = now
	}
	add(act)
	return nil
}

// room makes room for one more bucket of st, of bucket_id id: true when st
// and the process are below their bounds, or after abandoning st's buckets
// idle the longest until they are (their abandons added through add).
func (s *Server) room(ctx context.Context, st *stream, id *rlqspb.BucketId, now time.Time, add func(*rlqspb.RateLimitQuotaResponse_BucketAction)) bool {
	need := idBytes(id)
	for len(st.buckets) >= s.bounds.buckets || s.tracked.Load() >= int64(s.bounds.tracked) || st.idBytes+need > s.bounds.idBytes {
		var victim *bucket
		for _, b := range st.buckets {
			if !b.idle.IsZero() && (victim == nil || b.idle.Before(victim.idle)) {
				victim = b
			}
		}
		if victim == nil {
			return false
		}
		add(s.abandon(st, victim))
	}
	s.tracked.Add(1)
	st.idBytes += need
	return true
}

// idBytes is the bytes of a bucket_id's keys and values.
func idBytes(id *rlqspb.BucketId) int {
	n := 0
	for k, v := range id.GetBucket() {
		n += len(k) + len(v)
	}
	return n
}

// unmatched is the shape of a bucket that matches no limit.
func (s *Server) unmatched() shape {
	if s.opts.Unmatched == DenyUnmatched {
		return shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
	}
	return shape{blanket: typev3.RateLimitStrategy_ALLOW_ALL}
}

// untracked answers a bucket the stream does not keep: abandoned (Envoy
// drops it; its key's next request makes it again, under the filter's
// no_assignment_behavior, and reports it at once) unless busy, then the
// blanket rule sh for the TTL; counted by why.
func (s *Server) untracked(id *rlqspb.BucketId, sh shape, busy bool, why string) *rlqspb.RateLimitQuotaResponse_BucketAction {
	if m := s.opts.Metrics; m != nil {
		m.untracked.WithLabelValues(why).Inc()
	}
	if !busy {
		if m := s.opts.Metrics; m != nil {
			m.abandoned.Inc()
		}
		return abandonAction(id)
	}
	return action(id, sh, s.opts.TTL)
}

// unreadable says why a bucket_id cannot be read as a descriptor ("": it
// can): no entries, too many, an empty key, a key or value too long, too
// many bytes in all, or bytes that are not UTF-8 (decoded by the lenient
// codec, codec.go).
func unreadable(id *rlqspb.BucketId) string {
	if id == nil || len(id.Bucket) == 0 {
		return "empty"
	}
	if len(id.Bucket) > rlsconfig.MaxEntries {
		return "entries"
	}
	total := 0
	for k, v := range id.Bucket {
		switch {
		case rlsconfig.IsInvalidUTF8(k) || rlsconfig.IsInvalidUTF8(v) || !utf8.ValidString(k) || !utf8.ValidString(v):
			return "utf8" // first: an answer naming it would end the stream
		case len(k) == 0 || len(k) > MaxEntryBytes || len(v) > MaxEntryBytes:
			return "entry_bytes"
		}
		total += len(k) + len(v)
	}
	if total > MaxIDBytes {
		return "id_bytes"
	}
	return ""
}

// admitReport takes one report from st's report budget: false when there
// is none left.
func (st *stream) admitReport(now time.Time) bool {
	if d := now.Sub(st.last); d > 0 {
		st.reports = math.Min(ReportBurst, st.reports+d.Seconds()*ReportRate)
		st.last = now
	}
	if st.reports < 1 {
		return false
	}
	st.reports--
	return true
}

// checkReport fixes the stream's domain: the one thing a report can get
// wrong that ends the stream (InvalidArgument).
func (s *Server) checkReport(st *stream, msg *rlqspb.RateLimitQuotaUsageReports) error {
	switch {
	case len(msg.Domain) > MaxDomainBytes:
		return status.Errorf(codes.InvalidArgument, "rlqs: domain: at most %d bytes", MaxDomainBytes)
	case st.domain == "" && msg.Domain == "":
		return status.Error(codes.InvalidArgument, "rlqs: domain: required in the first report")
	case st.domain != "" && msg.Domain != "" && msg.Domain != st.domain:
		return status.Errorf(codes.InvalidArgument, "rlqs: domain: %q, but the stream's is %q", msg.Domain, st.domain)
	}
	if st.domain == "" {
		st.domain = msg.Domain
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
	case l.RequestsPerUnit == 0 || s.fixedWindow(l):
		b.sent = shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
		return b
	}
	b.key = s.opts.Naming.BucketKey(domain, entries, m.Values)
	b.rate = float64(l.RequestsPerUnit) / float64(l.Unit.Seconds())
	b.burst = float64(l.Capacity())
	b.sent = shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
	return b
}

// abandon tells Envoy to drop b; what it was assigned stays counted until
// its TTL has passed.
func (s *Server) abandon(st *stream, b *bucket) *rlqspb.RateLimitQuotaResponse_BucketAction {
	s.release(st, b)
	delete(st.buckets, canonical(b.id))
	s.tracked.Add(-1)
	st.idBytes -= idBytes(b.id)
	if m := s.opts.Metrics; m != nil {
		m.abandoned.Inc()
	}
	return abandonAction(b.id)
}

// abandonAction tells Envoy to drop the bucket id.
func abandonAction(id *rlqspb.BucketId) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{},
		},
	}
}
