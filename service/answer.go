package service

import (
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// Answer is the outcome of a Request (wire.Answer).
type Answer = wire.Answer

// BucketAnswer is the outcome for one bucket of a Request
// (wire.BucketAnswer): bucket.Decision with its waits rounded up to whole
// milliseconds, the unit of the wire, so a client rounds them once more as
// its headers need.
type BucketAnswer = wire.BucketAnswer

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

// LeaseAnswer and Grant are the answer to a lease call (wire.LeaseAnswer).
type (
	LeaseAnswer = wire.LeaseAnswer
	// ChargeAnswer is the answer to a charge call (wire.ChargeAnswer).
	ChargeAnswer = wire.ChargeAnswer
	Grant        = wire.Grant
)

// grant is the answer for lease bucket b that granted tokens (when the
// whole call did) and holds left after the call, gap as in report: package
// bucket's Report for a request of b.Min, rounded to the wire's units.
func grant(b *LeaseBucket, all bool, granted, left float64, gap int64) Grant {
	ok := all || left >= b.Min
	d := bucket.Limit{Rate: b.Rate, Burst: b.Burst}.Report(left, gap, b.Min, ok)
	return Grant{Tokens: granted, Remaining: d.Remaining, RetryAfterMs: ceilMs(d.RetryAfter), ResetMs: ceilMs(d.ResetAfter)}
}

// charged is the answer for one charged bucket that holds left tokens
// after the charge, gap ns ahead of now.
func charged(b *ChargeBucket, left float64, gap int64) BucketAnswer {
	d := bucket.Limit{Rate: b.Rate, Burst: b.Burst}.Report(left, gap, 0, true)
	return BucketAnswer{Allowed: true, Remaining: d.Remaining, ResetMs: ceilMs(d.ResetAfter)}
}

// ceilMs is d rounded up to whole milliseconds.
func ceilMs(d time.Duration) int64 {
	if d >= bucket.Never-time.Millisecond {
		return int64(d / time.Millisecond)
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
