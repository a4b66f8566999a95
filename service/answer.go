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
// this only rounds its exact waits to the wire's milliseconds. A quota's
// waits run to its period's end from now (Unix ns, the store's clock).
func report(b *wire.Bucket, ok bool, tokens float64, gap, now int64, wait time.Duration) wire.BucketAnswer {
	d := reportAt(b.Rate, b.Burst, b.Period, tokens, gap, now, b.Cost, ok)
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
func grant(b *wire.LeaseBucket, all bool, granted, left float64, gap, now int64) wire.Grant {
	ok := all || left >= b.Min
	d := reportAt(b.Rate, b.Burst, b.Period, left, gap, now, b.Min, ok)
	return wire.Grant{Tokens: granted, Remaining: d.Remaining, RetryAfterMs: ceilMs(d.RetryAfter), ResetMs: ceilMs(d.ResetAfter)}
}

// charged is the answer for one charged bucket that holds left tokens
// after the charge, gap ns ahead of now.
func charged(b *wire.ChargeBucket, left float64, gap, now int64) wire.BucketAnswer {
	d := reportAt(b.Rate, b.Burst, b.Period, left, gap, now, 0, true)
	return wire.BucketAnswer{Allowed: true, Remaining: d.Remaining, ResetMs: ceilMs(d.ResetAfter)}
}

// reportAt is package bucket's Report for a bucket of rate, burst and
// period p holding tokens, at now (Unix ns): a quota's waits run to its
// period's end (bucket's ReportAt).
func reportAt(rate, burst float64, p wire.Period, tokens float64, gap, now int64, cost float64, ok bool) bucket.Decision {
	return limitOf(rate, burst, p).ReportAt(tokens, now, gap, cost, ok)
}

// limitOf is package bucket's Limit of a bucket of rate, burst and period
// p: a quota's (Rate 0) when p is a period.
func limitOf(rate, burst float64, p wire.Period) bucket.Limit {
	l := bucket.Limit{Rate: rate, Burst: burst}
	if p.IsQuota() {
		l.PeriodStart, l.PeriodEnd = p.PeriodStartMs*int64(time.Millisecond), p.PeriodEndMs*int64(time.Millisecond)
	}
	return l
}

// periodNow is the time at which the memory store decides a bucket of
// period p at now (Unix ns): now for a token bucket; for a quota, now
// within the period [start, end - 1µs], as bucket.lua's in_period keeps a
// record's time, so that a caller's clock a little off the store's
// neither resets the period at every call nor carries it into the next.
func periodNow(now int64, p wire.Period) int64 {
	if !p.IsQuota() {
		return now
	}
	start, end := p.PeriodStartMs*int64(time.Millisecond), p.PeriodEndMs*int64(time.Millisecond)
	return min(max(now, start), end-int64(time.Microsecond))
}

// ceilMs is d rounded up to whole milliseconds.
func ceilMs(d time.Duration) int64 {
	if d >= bucket.Never-time.Millisecond {
		return int64(d / time.Millisecond)
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
