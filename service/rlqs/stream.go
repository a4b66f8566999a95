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

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rls"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

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
	ctx := service.WithCaller(context.Background(), st.caller)
	now := s.opts.Now()
	for _, b := range st.buckets {
		if b.key == "" {
			continue
		}
		s.shares.drop(b.key, st.id)
		if excess := b.held - s.residue(b, now); excess > 0 {
			_, _ = s.lease(ctx, b, 0, excess)
		}
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
	b := &bucket{id: id}
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
	case l.RequestsPerUnit == 0 || l.Algorithm == rlsconfig.FixedWindow:
		b.sent = shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
		return b
	}
	b.key = rls.BucketKey(domain, entries, m.Values)
	b.rate = float64(l.RequestsPerUnit) / float64(l.Unit.Seconds())
	b.burst = float64(l.Capacity())
	b.sent = shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
	return b
}

// abandon tells Envoy to drop b and returns what it holds beyond what Envoy
// could still admit before the abandon arrives.
func (s *Server) abandon(ctx context.Context, st *stream, b *bucket, now time.Time) (*rlqspb.RateLimitQuotaResponse_BucketAction, error) {
	s.shares.drop(b.key, st.id)
	delete(st.buckets, canonical(b.id))
	if m := s.opts.Metrics; m != nil {
		m.abandoned.Inc()
	}
	residue := 0.0
	if b.hasSent && now.Before(b.expiry) {
		residue = b.sent.most(s.opts.Grace)
	}
	if excess := b.held - residue; excess > 0 {
		if _, err := s.lease(ctx, b, 0, excess); err != nil {
			s.opts.Logger.Warn("rlqs: store", "key", b.key, "err", err)
		}
	}
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: b.id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{},
		},
	}, nil
}
