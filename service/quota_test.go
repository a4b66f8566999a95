package service

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// quotaClock is one clock for a test's store and its miniredis (limitd
// reports a quota's waits to the period's end by its own clock; the
// scripts count by Redis's).
type quotaClock struct {
	now time.Time
	m   *miniredis.Miniredis
}

func (c *quotaClock) set(t time.Time) {
	c.now = t
	if c.m != nil {
		c.m.SetTime(t)
	}
}

// quotaStores returns a Redis store (on miniredis) with its clock at t0.
func quotaStores(t *testing.T) map[string]struct {
	st    Store
	clock *quotaClock
	c     *redis.Client
} {
	out := map[string]struct {
		st    Store
		clock *quotaClock
		c     *redis.Client
	}{}
	rc := &quotaClock{now: t0}
	m, c, s := newMini(t, RedisOptions{Now: func() time.Time { return rc.now }})
	rc.m = m
	out["redis"] = struct {
		st    Store
		clock *quotaClock
		c     *redis.Client
	}{s, rc, c}
	return out
}

func quotaReq(key string, burst, cost float64, start, end time.Time) *wire.Request {
	return &wire.Request{Buckets: []wire.Bucket{{Key: key, Burst: burst, Cost: cost,
		Period: wire.Period{PeriodStartMs: start.UnixMilli(), PeriodEndMs: end.UnixMilli()}}}}
}

// TestStoreQuota: a quota admits its burst in a period and no more, waits
// to the period's end, is full again in the next period (same key: the
// period is not its identity), and a Redis record lives to the period's
// end plus quotaMargin.
func TestStoreQuota(t *testing.T) {
	ctx := context.Background()
	start := t0.Add(-10 * time.Minute).Truncate(time.Hour)
	end := start.Add(time.Hour)
	for name, s := range quotaStores(t) {
		t.Run(name, func(t *testing.T) {
			for i := range 3 {
				a, err := s.st.Decide(ctx, quotaReq("q", 3, 1, start, end))
				if err != nil || !a.Allowed || a.Buckets[0].Remaining != int64(2-i) || a.Buckets[0].ResetMs != ceilMs(end.Sub(t0)) {
					t.Fatalf("take %d = %+v, %v; want allowed, %d left, reset in %v", i, a, err, 2-i, end.Sub(t0))
				}
			}
			s.clock.set(t0.Add(time.Second))
			a, err := s.st.Decide(ctx, quotaReq("q", 3, 1, start, end))
			left := end.Sub(t0.Add(time.Second))
			if err != nil || a.Allowed || a.RetryAfterMs != ceilMs(left) || a.Buckets[0].ResetMs != ceilMs(left) {
				t.Fatalf("past the limit = %+v, %v; want refused, retry and reset in %v", a, err, left)
			}
			if s.c != nil {
				key := storageKey(DefaultKeyPrefix, "q", 0, 3)
				if pttl := s.c.PTTL(ctx, key).Val(); pttl < left+quotaMargin || pttl > left+quotaMargin+2*time.Millisecond {
					t.Fatalf("PTTL = %v, want the period's end plus %v (%v)", pttl, quotaMargin, left+quotaMargin)
				}
			}
			// The next period: full again.
			s.clock.set(end)
			a, err = s.st.Decide(ctx, quotaReq("q", 3, 1, end, end.Add(time.Hour)))
			if err != nil || !a.Allowed || a.Buckets[0].Remaining != 2 || a.Buckets[0].ResetMs != time.Hour.Milliseconds() {
				t.Fatalf("next period = %+v, %v; want allowed, 2 left, reset in 1h", a, err)
			}
		})
	}
}

// TestStoreQuotaSkew: a caller whose clock is ahead of the store's (a
// period that starts after the store's now) resets the period once, not at
// every call; a caller whose clock lags (the previous period, after the
// store's clock passed its end) counts against the current record and
// neither resets it nor shortens its life.
func TestStoreQuotaSkew(t *testing.T) {
	ctx := context.Background()
	start := t0.Add(5 * time.Second) // the caller's period starts 5s after the store's now
	end := start.Add(time.Minute)
	for name, s := range quotaStores(t) {
		t.Run(name, func(t *testing.T) {
			for i := range 4 {
				a, err := s.st.Decide(ctx, quotaReq("q", 3, 1, start, end))
				if err != nil || a.Allowed != (i < 3) {
					t.Fatalf("take %d = %+v, %v; want the burst of 3 once", i, a, err)
				}
			}
			// A lagging caller, on the previous period, once the store's
			// clock is past its end: it finds the current record.
			s.clock.set(end.Add(-time.Second))
			a, err := s.st.Decide(ctx, quotaReq("q", 3, 1, start.Add(-time.Minute), start))
			if err != nil || a.Allowed {
				t.Fatalf("lagging caller = %+v, %v; want refused by the current period's record", a, err)
			}
			if s.c != nil {
				key := storageKey(DefaultKeyPrefix, "q", 0, 3)
				if pttl := s.c.PTTL(ctx, key).Val(); pttl < time.Second+quotaMargin {
					t.Fatalf("PTTL = %v after a lagging caller's call, want at least %v", pttl, time.Second+quotaMargin)
				}
			}
			// The next period (on the store's clock too) resets it.
			s.clock.set(end)
			if a, err = s.st.Decide(ctx, quotaReq("q", 3, 1, end, end.Add(time.Minute))); err != nil || !a.Allowed || a.Buckets[0].Remaining != 2 {
				t.Fatalf("next period = %+v, %v; want allowed, 2 left", a, err)
			}
		})
	}
}

// TestStoreQuotaLeaseCharge: leases come from the period's remainder, a
// charge takes it into debt (at most a burst) and a refund gives back what
// the caller reserved, all in the period's record; the next period forgives
// the debt.
func TestStoreQuotaLeaseCharge(t *testing.T) {
	ctx := context.Background()
	start := t0.Truncate(time.Hour)
	end := start.Add(time.Hour)
	p := wire.Period{PeriodStartMs: start.UnixMilli(), PeriodEndMs: end.UnixMilli()}
	for name, s := range quotaStores(t) {
		t.Run(name, func(t *testing.T) {
			l, err := s.st.Lease(ctx, &wire.LeaseRequest{Buckets: []wire.LeaseBucket{{Key: "q", Burst: 10, Want: 6, Min: 1, Period: p}}})
			if err != nil || !l.Granted || l.Buckets[0].Tokens != 6 || l.Buckets[0].Remaining != 4 {
				t.Fatalf("lease = %+v, %v; want 6 granted, 4 left", l, err)
			}
			l, err = s.st.Lease(ctx, &wire.LeaseRequest{Buckets: []wire.LeaseBucket{{Key: "q", Burst: 10, Want: 6, Min: 5, Period: p}}})
			if err != nil || l.Granted || l.Buckets[0].RetryAfterMs != ceilMs(end.Sub(t0)) {
				t.Fatalf("lease past the remainder = %+v, %v; want refused until the period's end", l, err)
			}
			c, err := s.st.Charge(ctx, &wire.ChargeRequest{Buckets: []wire.ChargeBucket{{Key: "q", Burst: 10, Amount: 30, Period: p}}})
			if err != nil || c.Buckets[0].Remaining != 0 || c.Buckets[0].Applied != 14 {
				t.Fatalf("charge = %+v, %v; want 14 taken: a debt of one burst", c, err)
			}
			a, err := s.st.Decide(ctx, &wire.Request{Buckets: []wire.Bucket{{Key: "q", Burst: 10, Cost: 1, Period: p}}})
			if err != nil || a.Allowed {
				t.Fatalf("decide in debt = %+v, %v; want refused", a, err)
			}
			s.clock.set(end)
			p2 := wire.Period{PeriodStartMs: end.UnixMilli(), PeriodEndMs: end.Add(time.Hour).UnixMilli()}
			a, err = s.st.Decide(ctx, &wire.Request{Buckets: []wire.Bucket{{Key: "q", Burst: 10, Cost: 1, Period: p2}}})
			if err != nil || !a.Allowed || a.Buckets[0].Remaining != 9 {
				t.Fatalf("next period = %+v, %v; want the debt forgiven, 9 left", a, err)
			}
		})
	}
}
