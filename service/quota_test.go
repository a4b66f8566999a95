package service

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
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

// quotaStores returns a Redis store (on miniredis) and a memory store, each
// with its clock at t0.
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
	mc := &quotaClock{now: t0}
	out["memory"] = struct {
		st    Store
		clock *quotaClock
		c     *redis.Client
	}{NewMemoryStore(MemoryOptions{Now: func() int64 { return mc.now.UnixNano() }}), mc, nil}
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

// TestRedisQuotaDifferential holds decide.lua's quota mode to package
// bucket's quotas (Limit with PeriodStart and PeriodEnd): the same times
// and costs, over periods of 1s to a minute that the clock crosses, give
// the same decisions, remaining tokens, waits to the period's end and
// bit-identical tokens; every record short of full expires at its period's
// end plus quotaMargin (within 2ms), and a full one is deleted.
func TestRedisQuotaDifferential(t *testing.T) {
	seeds := uint64(16)
	if testing.Short() {
		seeds = 4
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			t.Parallel()
			runQuotaDifferential(t, seed)
		})
	}
}

func runQuotaDifferential(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 41))
	var nowUs int64
	m, c, s := newMini(t, RedisOptions{Now: func() time.Time { return time.UnixMicro(nowUs) }})
	ctx := context.Background()
	n := 1 + int(seed%3)
	req := &wire.Request{Buckets: make([]wire.Bucket, n)}
	lims := make([]bucket.Limit, n)
	lengths := make([]int64, n) // each bucket's period, ms
	states := make([]bucket.State, n)
	keys := make([]string, n)
	origin := t0.Truncate(time.Minute).UnixMilli()
	for i := range n {
		lengths[i] = []int64{1000, 2500, 60000}[r.IntN(3)]
		burst := float64(1 + r.IntN(20))
		if r.IntN(3) == 0 {
			burst = math.Round(r.Float64()*1000*100)/100 + 0.5
		}
		lims[i] = bucket.Limit{Burst: burst}
		req.Buckets[i].Key = "q" + strconv.Itoa(i)
		keys[i] = storageKey(DefaultKeyPrefix, req.Buckets[i].Key, 0, burst)
	}
	nowUs = t0.UnixMicro()
	costs := make([]float64, n)
	delays := make([]int64, n)
	resets := 0
	for step := range 300 {
		switch p := r.IntN(20); {
		case p < 3:
		case p == 3:
			nowUs += int64(r.IntN(3000)) * 1000 // often across a period
		default:
			nowUs += int64(r.IntN(200000))
		}
		now := nowUs * 1000
		for i := range n {
			ps := origin + (nowUs/1000-origin)/lengths[i]*lengths[i]
			lims[i].PeriodStart, lims[i].PeriodEnd = ps*1e6, (ps+lengths[i])*1e6
			if states[i].At > 0 && states[i].At < lims[i].PeriodStart {
				resets++
			}
			costs[i] = randomCost(r, lims[i])
			req.Buckets[i].Burst, req.Buckets[i].Cost = lims[i].Burst, costs[i]
			req.Buckets[i].Period = wire.Period{PeriodStartMs: ps, PeriodEndMs: ps + lengths[i]}
		}
		m.SetTime(time.UnixMicro(nowUs))
		got, err := s.Decide(ctx, req)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if err := checkAgainstBucket(got, lims, states, now, costs, delays); err != nil {
			t.Fatalf("step %d at +%dus: %v", step, nowUs-t0.UnixMicro(), err)
		}
		all, nexts, _ := takeAll(lims, states, now, costs, delays)
		if !all {
			continue
		}
		copy(states, nexts)
		for i := range n {
			full := lims[i].FullAt(states[i])
			if full <= now {
				states[i] = bucket.State{}
			}
			v, err := c.Get(ctx, keys[i]).Result()
			if err == redis.Nil {
				if full > now {
					t.Fatalf("step %d: quota %d deleted, but it is full only at +%v", step, i, time.Duration(full-now))
				}
				continue
			}
			f := strings.Fields(v)
			if tok, _ := strconv.ParseFloat(f[0], 64); tok != states[i].Tokens || f[1] != strconv.FormatInt(states[i].At/1000, 10) {
				t.Fatalf("step %d: quota %d stored %q, want tokens %v at %dus", step, i, v, states[i].Tokens, states[i].At/1000)
			}
			want := time.Duration(lims[i].PeriodEnd-now) + quotaMargin
			if pttl := c.PTTL(ctx, keys[i]).Val(); pttl < want || pttl > want+2*time.Millisecond {
				t.Fatalf("step %d: quota %d expires in %v, want its period's end plus %v (%v)", step, i, pttl, quotaMargin, want)
			}
		}
	}
	if resets == 0 {
		t.Error("no period crossed with a record: the resets go untested")
	}
}

// TestQuotaHostilePeriods: a caller's period far from limitd's clock is
// refused with the field's path, on every call, before the store: one that
// starts more than quotaMargin ahead (it would reset a quota early and lock
// its record in the future until then, refusing every gateway's current
// period), or ended more than quotaMargin ago (a stale period).
func TestQuotaHostilePeriods(t *testing.T) {
	s, err := NewServer(Config{Store: NewMemoryStore(MemoryOptions{Now: func() int64 { return t0.UnixNano() }}), StoreName: "memory",
		Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	ms := func(d time.Duration) string { return strconv.FormatInt(t0.Add(d).UnixMilli(), 10) }
	period := func(from, to time.Duration) string {
		return `"tokens_per_second":0,"burst":5,"period_start_ms":` + ms(from) + `,"period_end_ms":` + ms(to)
	}
	for _, tc := range []struct{ name, bucket string }{
		{"a year ahead", period(365*24*time.Hour, 366*24*time.Hour)},
		{"just over a minute ahead", period(quotaMargin+time.Second, time.Hour)},
		{"ended long ago", period(-2*time.Hour, -time.Hour)},
	} {
		for path, extra := range map[string]string{"/v1/decide": `,"cost":1`, "/v1/lease": `,"want":1,"min":1`, "/v1/charge": `,"amount":1`} {
			t.Run(tc.name+path, func(t *testing.T) {
				w := do(s, "POST", path, `{"buckets":[{"key":"q",`+tc.bucket+extra+`}]}`)
				if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "buckets[0].period_") || !strings.Contains(w.Body.String(), "limitd's clock") {
					t.Fatalf("%d %s, want 400 naming the period against limitd's clock", w.Code, w.Body)
				}
			})
		}
	}
	// A period that holds the clock, and one a little ahead or just over.
	for _, b := range []string{period(-time.Minute, time.Hour), period(quotaMargin, time.Hour), period(-time.Hour, -quotaMargin)} {
		if w := do(s, "POST", "/v1/decide", `{"buckets":[{"key":"q",`+b+`,"cost":1}]}`); w.Code != http.StatusOK {
			t.Fatalf("%s: %d %s, want 200", b, w.Code, w.Body)
		}
	}
}
