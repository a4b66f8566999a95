package service

// The decision core: what every front door of limitd calls.
//
// Model. A Store holds token buckets (and fixed-window counters) and takes
// each call atomically: every bucket of a decision is consumed or none is, a
// lease grants every bucket its minimum or none, a charge always lands. The
// doors differ only in what they read and write on the wire: the HTTP API
// (server.go) decodes package wire's requests, the rate limit service
// (package rls) turns descriptors into buckets and counters, the quota
// service (package rlqs) debits what its Envoys report. All three reach the
// buckets through Store, and every decision through Decide.
//
// Guarantees. The Redis store's decisions are exact across every limitd
// sharing its Redis (one Lua script per slot, package bucket's arithmetic,
// held to it by differential tests), the memory store's within one
// process; an error means nothing is known of the call (it may have landed
// before a connection broke), never that it was refused. Decide adds
// shadow buckets that never change the enforced decision, and a held
// request's reservation that its caller can give back.

import (
	"context"
	"slices"
	"sync"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// Store decides requests. Implementations are safe for concurrent use.
type Store interface {
	// Decide takes req atomically: every bucket is consumed or none is. An
	// error means nothing is known about the decision (it may have been taken
	// in Redis before a connection broke); a *wire.FieldError means the store
	// cannot take this request as sent.
	Decide(ctx context.Context, req *wire.Request) (wire.Answer, error)
	// Lease takes a lease call atomically: every bucket takes back its
	// return, then grants at least its min or none grants; errors as for
	// Decide.
	Lease(ctx context.Context, req *wire.LeaseRequest) (wire.LeaseAnswer, error)
	// Charge charges each bucket its amount (a cost known from the
	// response): into debt down to -burst, or a refund; it cannot be
	// refused. Errors as for Decide.
	Charge(ctx context.Context, req *wire.ChargeRequest) (wire.ChargeAnswer, error)
	// Count adds hits to fixed-window counters (window.go); errors as for
	// Decide.
	Count(ctx context.Context, req *CountRequest) (CountAnswer, error)
	// Ping reports whether the store can take decisions.
	Ping(ctx context.Context) error
	// Close releases the store; calls in flight finish first.
	Close() error
}

// Decide asks st for req's answer. The enforced buckets are one atomic
// decision, as a Store makes it; each shadow bucket is a decision of its own,
// run beside it, so that a shadow bucket never changes what happens to the
// enforced ones (nor they to it), exactly as a shadow rule is decided in the
// plugin. A request without shadow buckets is one call of st.Decide.
//
// A shadow bucket whose own decision fails never fails the request either:
// it is answered allowed (a shadow bucket never refuses) and counted in the
// second result; only the enforced decision's error is returned.
//
// A request whose enforced buckets may hold it (one of them has a
// max_delay_ms) reserves what each of its enforced buckets takes as the
// caller's, as a refundable bucket does (heldRefundable): a held request
// whose client goes away gives back what it took with a charge's refund.
func Decide(ctx context.Context, st Store, req *wire.Request) (wire.Answer, int, error) {
	shadows, held := 0, false
	for i := range req.Buckets {
		if req.Buckets[i].Shadow {
			shadows++
		} else if req.Buckets[i].MaxDelayMs > 0 {
			held = true
		}
	}
	if shadows == 0 {
		a, err := st.Decide(ctx, heldRefundable(req, held))
		return a, 0, err
	}
	enforced := &wire.Request{HashTag: req.HashTag, Buckets: make([]wire.Bucket, 0, len(req.Buckets)-shadows)}
	for _, b := range req.Buckets {
		if !b.Shadow {
			b.Refundable = b.Refundable || held
			enforced.Buckets = append(enforced.Buckets, b)
		}
	}
	a := wire.Answer{Buckets: make([]wire.BucketAnswer, len(req.Buckets))}
	errs := make([]error, len(req.Buckets))
	var enforcedErr error
	var wg sync.WaitGroup
	for i := range req.Buckets {
		if !req.Buckets[i].Shadow {
			continue
		}
		wg.Go(func() {
			b := req.Buckets[i]
			b.Shadow = false // to the store, a decision of its own like any other
			one := &wire.Request{HashTag: req.HashTag, Buckets: []wire.Bucket{b}}
			var sa wire.Answer
			if sa, errs[i] = st.Decide(ctx, one); errs[i] == nil {
				a.Buckets[i] = sa.Buckets[0]
			}
		})
	}
	var ea wire.Answer
	if len(enforced.Buckets) > 0 {
		ea, enforcedErr = st.Decide(ctx, enforced)
	}
	wg.Wait()
	if enforcedErr != nil {
		return wire.Answer{}, 0, enforcedErr
	}
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			a.Buckets[i] = wire.BucketAnswer{Allowed: true}
		}
	}
	j := 0
	for i := range req.Buckets {
		if !req.Buckets[i].Shadow {
			a.Buckets[i] = ea.Buckets[j]
			j++
		}
	}
	a.Settle(req)
	return a, failed, nil
}

// heldRefundable returns req, or, when held (an enforced bucket may hold the
// request) and some bucket is not refundable, a copy whose buckets all are.
// A held request's take is a reservation like a refundable one's: its
// client may go away before the wait is over, and the gateway then refunds
// what each bucket took (a charge of -cost), which the ledger gives back only
// when it recorded the take as the caller's reservation. Once per take:
// refunds are clamped to the reservations outstanding.
func heldRefundable(req *wire.Request, held bool) *wire.Request {
	if !held || !slices.ContainsFunc(req.Buckets, func(b wire.Bucket) bool { return !b.Refundable }) {
		return req
	}
	cp := &wire.Request{HashTag: req.HashTag, Buckets: slices.Clone(req.Buckets)}
	for i := range cp.Buckets {
		cp.Buckets[i].Refundable = true
	}
	return cp
}
