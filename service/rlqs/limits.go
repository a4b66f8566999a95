package rlqs

import (
	"context"
	"math"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// holder names b of st for the allocator.
func holder(st *stream, b *bucket) Holder {
	return Holder{Stream: st.id, Caller: st.caller, Bucket: canonical(b.id)}
}

// release tells the allocator that b of st is no longer reported.
func (s *Server) release(st *stream, b *bucket) {
	if b.key != "" {
		s.alloc.Release(b.key, holder(st, b))
	}
}

// refresh reads b's limit again from cfg, a configuration loaded since b's
// (a reload reaches the buckets that keep reporting): a bucket whose key
// changed leaves its old limit's shares, its commitments there counted
// until they lapse.
func (s *Server) refresh(st *stream, b *bucket, cfg *rlsconfig.Config) *bucket {
	nb := s.newBucket(cfg, st.domain, b.id)
	if nb.key != b.key {
		s.release(st, b)
	}
	nb.idle, nb.served = b.idle, b.served
	return nb
}

// fixedWindow reports whether ShouldRateLimit counts l as a fixed window
// (its own algorithm, or the service's when it names none): such a limit is
// a counter in the store that the quota service cannot divide as a token
// bucket, and dividing its rate apart would admit it twice on a descriptor
// both doors serve. It is answered DENY_ALL, logged once per limit.
func (s *Server) fixedWindow(l *rlsconfig.RateLimit) bool {
	if l.Algorithm != rlsconfig.FixedWindow && (l.Algorithm != rlsconfig.Default || s.opts.Algorithm != rlsconfig.FixedWindow) {
		return false
	}
	if _, done := s.fixedLogged.LoadOrStore(l, true); !done {
		s.opts.Logger.Warn("rlqs: a fixed_window limit is answered DENY_ALL: the quota service divides token buckets only",
			"unit", l.Unit.String(), "requests_per_unit", l.RequestsPerUnit)
	}
	return true
}

// debit takes what b's Envoy reports it allowed from the store's bucket of
// b's key, under the stream's caller, so that ShouldRateLimit and
// /v1/lease on the same descriptor see the quota service's traffic, one
// report late. It is best effort: a failed call is logged and counted, and
// assignments do not depend on it (the Allocator's counts do not).
func (s *Server) debit(ctx context.Context, b *bucket, allowed float64) {
	if allowed <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	a, err := s.opts.Store.Lease(ctx, &wire.LeaseRequest{Buckets: []wire.LeaseBucket{{
		Key: b.key, Rate: b.rate, Burst: b.burst, Want: math.Min(allowed, b.burst),
	}}})
	m := s.opts.Metrics
	if m != nil {
		m.storeCalls.Inc()
	}
	if err != nil {
		if m != nil {
			m.storeErrs.Inc()
		}
		s.opts.Logger.Warn("rlqs: store", "key", b.key, "err", err)
		return
	}
	if m != nil && len(a.Buckets) == 1 {
		m.leased.Add(a.Buckets[0].Tokens)
	}
}
