package service

import (
	"math"
	"strconv"
)

// Decision is the outcome of a Request.
type Decision struct {
	// Allowed reports whether the request was admitted (every bucket had
	// enough tokens, and all were consumed).
	Allowed bool
	// RetryAfterMs is 0 when allowed, else the largest RetryAfterMs of the
	// buckets that refused.
	RetryAfterMs int64
	// Buckets holds one entry per requested bucket, in request order.
	Buckets []BucketDecision
}

// BucketDecision is the outcome for one bucket of a Request, in the units of
// bucket.Decision but with waits in milliseconds (rounded up), so a client can
// round them as its headers need.
type BucketDecision struct {
	// Allowed reports whether this bucket alone had enough tokens. It can be
	// true in a refused request, when another bucket refused; nothing was
	// consumed then.
	Allowed bool
	// Remaining is floor(tokens after the decision): after consumption when
	// the request was admitted, the untouched tokens otherwise.
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

// These mirror package bucket's unexported arithmetic (slack, whole,
// refillIn, fullIn) so waits can be reported in milliseconds rather than the whole
// seconds of bucket.Decision; the differential tests hold them in step.
const (
	nsPerSecond = 1_000_000_000
	relSlack    = 1e-12
)

// slack is the tokens by which a threshold may be missed and still count as
// reached (see package bucket).
func slack(b *Bucket) float64 { return b.Rate*1e-9 + relSlack*b.Burst }

// refillIn is the whole nanoseconds (rounded up) to refill x tokens at rate;
// 0 when x <= 0. Validated limits keep it far below 2^53.
func refillIn(x, rate float64) int64 {
	if !(x > 0) {
		return 0
	}
	return int64(math.Ceil(x / rate * nsPerSecond))
}

// ceilMs is ns rounded up to whole milliseconds.
func ceilMs(ns int64) int64 { return (ns + 999_999) / 1_000_000 }

// report fills in the decision for bucket b that holds tokens after the
// decision, whose own time is gap nanoseconds ahead of the clock (non-zero
// only when the clock went backwards), and that alone admitted its cost when
// ok.
func report(b *Bucket, ok bool, tokens float64, gap int64) BucketDecision {
	s := slack(b)
	d := BucketDecision{Allowed: ok, Tokens: tokens}
	if w := math.Floor(min(tokens+s, b.Burst)); w > 0 {
		d.Remaining = int64(w)
	}
	d.ResetMs = ceilMs(gap + refillIn(b.Burst-tokens-relSlack*b.Burst, b.Rate))
	if !ok {
		d.RetryAfterMs = max(1, ceilMs(gap+refillIn(b.Cost-tokens-s, b.Rate)))
	}
	return d
}

// finish sets Allowed and RetryAfterMs of d from its buckets.
func (d *Decision) finish() {
	d.Allowed = true
	d.RetryAfterMs = 0
	for i := range d.Buckets {
		if !d.Buckets[i].Allowed {
			d.Allowed = false
			d.RetryAfterMs = max(d.RetryAfterMs, d.Buckets[i].RetryAfterMs)
		}
	}
}

// AppendJSON appends the HTTP answer for d:
//
//	{"allowed":false,"retry_after_ms":250,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":250,"reset_ms":4000}]}
func (d *Decision) AppendJSON(b []byte) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, d.RetryAfterMs, 10)
	b = append(b, `,"buckets":[`...)
	for i := range d.Buckets {
		bd := &d.Buckets[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"allowed":`...)
		b = strconv.AppendBool(b, bd.Allowed)
		b = append(b, `,"remaining":`...)
		b = strconv.AppendInt(b, bd.Remaining, 10)
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, bd.RetryAfterMs, 10)
		b = append(b, `,"reset_ms":`...)
		b = strconv.AppendInt(b, bd.ResetMs, 10)
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}
