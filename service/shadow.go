package service

import (
	"context"
	"slices"
	"sync"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// decide asks st for req's answer. The enforced buckets are one atomic
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
func decide(ctx context.Context, st Store, req *wire.Request) (wire.Answer, int, error) {
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
