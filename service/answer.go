package service

import (
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// report is the answer for bucket b that holds tokens after the decision,
// whose own time is gap nanoseconds ahead of the clock (non-zero only when
// the clock went backwards), that alone admitted its cost when ok, and whose
// request must wait (bucket.Decision.Wait: 0 unless its take was delayed and
// consumed). The arithmetic is package bucket's (Limit.Report, Limit.Reserve);
// this only rounds its exact waits to the wire's milliseconds.
func report(b *wire.Bucket, ok bool, tokens float64, gap int64, wait time.Duration) wire.BucketAnswer {
	d := bucket.Limit{Rate: b.Rate, Burst: b.Burst}.Report(tokens, gap, b.Cost, ok)
	return wire.BucketAnswer{
		Allowed:      ok,
		Remaining:    d.Remaining,
		RetryAfterMs: ceilMs(d.RetryAfter),
		ResetMs:      ceilMs(d.ResetAfter),
		WaitMs:       ceilMs(wait),
		Tokens:       tokens,
	}
}

// grant is the answer for lease bucket b that granted tokens (when the
// whole call did) and holds left after the call, gap as in report: package
// bucket's Report for a request of b.Min, rounded to the wire's units.
func grant(b *wire.LeaseBucket, all bool, granted, left float64, gap int64) wire.Grant {
	ok := all || left >= b.Min
	d := bucket.Limit{Rate: b.Rate, Burst: b.Burst}.Report(left, gap, b.Min, ok)
	return wire.Grant{Tokens: granted, Remaining: d.Remaining, RetryAfterMs: ceilMs(d.RetryAfter), ResetMs: ceilMs(d.ResetAfter)}
}

// charged is the answer for one charged bucket that holds left tokens
// after the charge, gap ns ahead of now.
func charged(b *wire.ChargeBucket, left float64, gap int64) wire.BucketAnswer {
	d := bucket.Limit{Rate: b.Rate, Burst: b.Burst}.Report(left, gap, 0, true)
	return wire.BucketAnswer{Allowed: true, Remaining: d.Remaining, ResetMs: ceilMs(d.ResetAfter)}
}

// ceilMs is d rounded up to whole milliseconds.
func ceilMs(d time.Duration) int64 {
	if d >= bucket.Never-time.Millisecond {
		return int64(d / time.Millisecond)
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
