package service

import (
	"strconv"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
)

// Answer is the outcome of a Request: the service's answer to one POST
// /v1/decide.
type Answer struct {
	// Allowed reports whether the request was admitted: every enforced
	// bucket had enough tokens, and all of them were consumed. Shadow buckets
	// do not count (it is true for a request of shadow buckets only).
	Allowed bool
	// RetryAfterMs is 0 when allowed, else the largest RetryAfterMs of the
	// enforced buckets that refused.
	RetryAfterMs int64
	// Buckets holds one entry per requested bucket, in request order.
	Buckets []BucketAnswer
}

// BucketAnswer is the outcome for one bucket of a Request: bucket.Decision
// with its waits rounded up to whole milliseconds, the unit of the wire, so
// a client rounds them once more as its headers need.
type BucketAnswer struct {
	// Allowed reports whether this bucket alone had enough tokens. An
	// enforced bucket can be allowed in a refused request, when another
	// bucket refused; nothing was consumed then. A shadow bucket is decided
	// on its own: allowed means it was consumed.
	Allowed bool
	// Remaining is floor(tokens after the decision): after consumption when
	// the bucket was consumed, the untouched tokens otherwise.
	Remaining int64
	// RetryAfterMs is 0 when this bucket allowed; otherwise the milliseconds
	// until it would, at least 1.
	RetryAfterMs int64
	// ResetMs is the milliseconds until this bucket is full again.
	ResetMs int64
	// Tokens is the exact (fractional) tokens behind Remaining. It is not
	// part of the HTTP answer; tests compare it with package bucket.
	Tokens float64
}

// report is the answer for bucket b that holds tokens after the decision,
// whose own time is gap nanoseconds ahead of the clock (non-zero only when
// the clock went backwards), and that alone admitted its cost when ok. The
// arithmetic is package bucket's (Limit.Report); this only rounds its exact
// waits to the wire's milliseconds.
func report(b *Bucket, ok bool, tokens float64, gap int64) BucketAnswer {
	d := bucket.Limit{Rate: b.Rate, Burst: b.Burst}.Report(tokens, gap, b.Cost, ok)
	return BucketAnswer{
		Allowed:      ok,
		Remaining:    d.Remaining,
		RetryAfterMs: ceilMs(d.RetryAfter),
		ResetMs:      ceilMs(d.ResetAfter),
		Tokens:       tokens,
	}
}

// ceilMs is d rounded up to whole milliseconds.
func ceilMs(d time.Duration) int64 {
	if d >= bucket.Never-time.Millisecond {
		return int64(d / time.Millisecond)
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// finish sets Allowed and RetryAfterMs of a from its enforced buckets.
func (a *Answer) finish(req *Request) {
	a.Allowed = true
	a.RetryAfterMs = 0
	for i := range a.Buckets {
		if !a.Buckets[i].Allowed && !req.Buckets[i].Shadow {
			a.Allowed = false
			a.RetryAfterMs = max(a.RetryAfterMs, a.Buckets[i].RetryAfterMs)
		}
	}
}

// AppendJSON appends the HTTP answer for a:
//
//	{"allowed":false,"retry_after_ms":250,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":250,"reset_ms":4000}]}
func (a *Answer) AppendJSON(b []byte) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, a.Allowed)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, a.RetryAfterMs, 10)
	b = append(b, `,"buckets":[`...)
	for i := range a.Buckets {
		ba := &a.Buckets[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"allowed":`...)
		b = strconv.AppendBool(b, ba.Allowed)
		b = append(b, `,"remaining":`...)
		b = strconv.AppendInt(b, ba.Remaining, 10)
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, ba.RetryAfterMs, 10)
		b = append(b, `,"reset_ms":`...)
		b = strconv.AppendInt(b, ba.ResetMs, 10)
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}
