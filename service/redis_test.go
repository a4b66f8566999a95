package service

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// t0 is the base of the test timelines: a Unix time in whole microseconds
// (Redis TIME's resolution).
var t0 = time.Unix(1_700_000_000, 123_456_000)

// newMini returns a miniredis whose clock (TIME, and key expiry) is set by the
// test, a client on it and a store with opts.
func newMini(t *testing.T, opts RedisOptions) (*miniredis.Miniredis, *redis.Client, *RedisStore) {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(t0)
	m.ClockTTL(true)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	s, err := NewRedisStore(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return m, c, s
}

func one(key string, rate, burst, cost float64) *wire.Request {
	return &wire.Request{Buckets: []wire.Bucket{{Key: key, Rate: rate, Burst: burst, Cost: cost}}}
}

// refundable is one's decision for a rule that can refund: its cost is
// recorded as the caller's reservation.
func refundable(key string, rate, burst, cost float64) *wire.Request {
	r := one(key, rate, burst, cost)
	r.Buckets[0].Refundable = true
	return r
}

func TestRedisTimeline(t *testing.T) {
	m, c, s := newMini(t, RedisOptions{})
	ctx := context.Background()
	ms := time.Millisecond
	// rate 2/s, burst 4
	steps := []struct {
		at                          time.Duration
		cost                        float64
		allowed                     bool
		remaining, retryMs, resetMs int64
		wantPTTL                    time.Duration // 0: don't check; -1: key absent
	}{
		{0, 1, true, 3, 0, 500, 501 * ms},
		{0, 3, true, 0, 0, 2000, 2001 * ms},
		{0, 1, false, 0, 500, 2000, 2001 * ms},
		{250 * ms, 1, false, 0, 250, 1750, 0},
		{500 * ms, 1, true, 0, 0, 2000, 2001 * ms},
		{10 * time.Second, 0, true, 4, 0, 0, -1}, // full again: forgotten
		{10 * time.Second, 5, false, 4, 500, 0, -1},
		{10 * time.Second, 0.25, true, 3, 0, 125, 126 * ms},
	}
	key := storageKey(DefaultKeyPrefix, "k", 2, 4)
	for i, st := range steps {
		m.SetTime(t0.Add(st.at))
		d, err := s.Decide(ctx, one("k", 2, 4, st.cost))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		b := d.Buckets[0]
		if d.Allowed != st.allowed || b.Allowed != st.allowed || b.Remaining != st.remaining ||
			b.RetryAfterMs != st.retryMs || d.RetryAfterMs != st.retryMs || b.ResetMs != st.resetMs {
			t.Errorf("step %d: Decide(at %v, cost %g) = %+v, want allowed %v remaining %d retry %dms reset %dms",
				i, st.at, st.cost, d, st.allowed, st.remaining, st.retryMs, st.resetMs)
		}
		switch pttl := c.PTTL(ctx, key).Val(); {
		case st.wantPTTL == -1 && pttl != -2*time.Nanosecond && pttl != -2*time.Millisecond:
			t.Errorf("step %d: PTTL = %v, want the key gone", i, pttl)
		case st.wantPTTL > 0 && pttl != st.wantPTTL:
			t.Errorf("step %d: PTTL = %v, want %v", i, pttl, st.wantPTTL)
		}
	}
}

func TestRedisKeyExpiresWhenFull(t *testing.T) {
	m, c, s := newMini(t, RedisOptions{})
	ctx := context.Background()
	if _, err := s.Decide(ctx, one("k", 10, 10, 10)); err != nil {
		t.Fatal(err)
	}
	key := storageKey(DefaultKeyPrefix, "k", 10, 10)
	m.SetTime(t0.Add(time.Second - time.Microsecond))
	if c.Exists(ctx, key).Val() != 1 {
		t.Fatal("key gone before the bucket is full")
	}
	m.SetTime(t0.Add(time.Second + time.Millisecond))
	if c.Exists(ctx, key).Val() != 0 {
		t.Fatal("key still there a millisecond after the bucket is full")
	}
}

// takeAll is the reference for a multi-bucket decision: package bucket on
// each (Reserve, which is Take for a bucket without a max delay), all or
// nothing.
func takeAll(lims []bucket.Limit, states []bucket.State, now int64, costs []float64, delays []int64) (bool, []bucket.State, []bucket.Decision) {
	all := true
	nexts := make([]bucket.State, len(lims))
	decs := make([]bucket.Decision, len(lims))
	for i := range lims {
		nexts[i], decs[i] = lims[i].Reserve(states[i], now, costs[i], time.Duration(delays[i])*time.Millisecond)
		all = all && decs[i].Allowed
	}
	return all, nexts, decs
}

// checkAgainstBucket compares a store's decision with package bucket's:
// the verdicts, the waits (a delayed bucket's wait_ms, and the answer's, the
// longest), remaining tokens and tokens to the bit.
func checkAgainstBucket(got wire.Answer, lims []bucket.Limit, states []bucket.State, now int64, costs []float64, delays []int64) error {
	all, nexts, decs := takeAll(lims, states, now, costs, delays)
	if got.Allowed != all {
		return fmt.Errorf("allowed = %v, bucket says %v", got.Allowed, all)
	}
	var longest time.Duration
	for i, gb := range got.Buckets {
		want := decs[i]
		wantTokens := nexts[i].Tokens
		if !all {
			wantTokens = lims[i].Tokens(states[i], now)
			if want.Allowed { // this bucket admitted, another refused: untouched, no wait
				want = lims[i].ReportAt(wantTokens, now, max(states[i].At, now)-now, costs[i], true)
			}
		}
		longest = max(longest, want.Wait)
		if gb.Allowed != decs[i].Allowed || gb.Remaining != want.Remaining ||
			gb.RetryAfterMs != ceilMs(want.RetryAfter) || gb.ResetMs != ceilMs(want.ResetAfter) ||
			gb.WaitMs != ceilMs(want.Wait) || gb.WaitMs > delays[i] ||
			math.Float64bits(gb.Tokens) != math.Float64bits(wantTokens) {
			return fmt.Errorf("bucket %d (limit %+v, state %+v, cost %g, max delay %dms): got %+v, bucket says %+v with tokens %v",
				i, lims[i], states[i], costs[i], delays[i], gb, want, wantTokens)
		}
	}
	if got.WaitMs != ceilMs(longest) {
		return fmt.Errorf("wait_ms = %d, bucket says %v", got.WaitMs, longest)
	}
	return nil
}

// smoothLimit is l with a burst below its rate, as a bucket that holds
// requests may have (wire: burst > 0 with a max_delay_ms): its debt can be
// many bursts deep.
func smoothLimit(r *rand.Rand, l bucket.Limit) bucket.Limit {
	l.Burst = max(1, math.Round(l.Rate*(0.05+0.9*r.Float64())))
	return l
}

// randomDelay draws a bucket's max_delay_ms: none half the time, else up to
// twice the time its burst takes to refill (at most wire.MaxDelayMs), now
// and then the most there is.
func randomDelay(r *rand.Rand, l bucket.Limit) int64 {
	switch p := r.IntN(10); {
	case p < 5:
		return 0
	case p == 5:
		return wire.MaxDelayMs
	}
	return min(1+int64(r.Float64()*2*l.Burst/l.Rate*1000), wire.MaxDelayMs)
}

// randomLimit draws a limit: rates log-uniform in [0.5, 10^4], bursts 1 to
// 30 times the rate, half of them whole numbers.
func randomLimit(r *rand.Rand) bucket.Limit {
	rate := 0.5 * math.Pow(2e4, r.Float64())
	burst := rate * (1 + 29*r.Float64())
	if r.IntN(2) == 0 {
		burst = math.Ceil(burst)
	}
	if r.IntN(4) == 0 {
		rate = math.Round(rate*100) / 100
	}
	return bucket.Limit{Rate: max(rate, 0.5), Burst: burst}
}

func randomCost(r *rand.Rand, l bucket.Limit) float64 {
	switch p := r.IntN(20); {
	case p == 0:
		return 0
	case p == 1:
		return math.Floor(l.Burst) + 1 + float64(r.IntN(3)) // above burst
	case p < 6:
		return math.Round(r.Float64()*l.Burst*100) / 100 // fractional
	}
	return float64(1 + r.IntN(3))
}

// randomStep is the time to the next decision, in microseconds: mostly
// around the time the cost takes to refill, sometimes nothing, sometimes a
// long idle, and (when backwards) sometimes a jump back.
func randomStep(r *rand.Rand, l bucket.Limit, cost float64, backwards bool) int64 {
	refill := max(cost, 1) / l.Rate * 1e6
	switch p := r.IntN(20); {
	case p < 2:
		return 0
	case p == 2:
		return int64(r.Float64() * 2 * l.Burst / l.Rate * 1e6)
	case p == 3 && backwards:
		return -int64(r.Float64() * 1e6)
	}
	return int64(r.Float64() * 1.5 * refill)
}

// TestRedisDifferential feeds the same times and costs to package bucket and
// to the Lua script (on miniredis, whose TIME the test sets) and demands the
// same decisions, remaining tokens and waits, and bit-identical tokens. In
// the delay modes the buckets carry random max delays (package bucket's
// Reserve): delayed takes into debt, waits and refusals past the bound.
//
// With the expiring clock on, times only move forward, and every stored key
// must live until the bucket package calls it full and vanish within 2ms
// after; a key that expired reads as a full bucket, which the reference
// follows (it matters when a rule's limit changed since the key was written).
// With it off, the clock also jumps backwards.
func TestRedisDifferential(t *testing.T) {
	for _, mode := range []struct {
		name             string
		backwards, delay bool
	}{{"forward-with-expiry", false, false}, {"backwards-clock", true, false},
		{"delay-forward-with-expiry", false, true}, {"delay-backwards-clock", true, true}} {
		seeds := uint64(16)
		if testing.Short() {
			seeds = 4
		}
		for seed := uint64(1); seed <= seeds; seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", mode.name, seed), func(t *testing.T) {
				t.Parallel()
				runDifferential(t, seed, mode.backwards, mode.delay)
			})
		}
	}
}

func runDifferential(t *testing.T, seed uint64, backwards, delay bool) {
	r := rand.New(rand.NewPCG(seed, 42))
	m, c, s := newMini(t, RedisOptions{})
	m.ClockTTL(!backwards) // miniredis expiry counts down; it cannot follow a clock jumping back
	ctx := context.Background()
	n := 1 + int(seed%3)
	req := &wire.Request{Buckets: make([]wire.Bucket, n)}
	if seed%2 == 0 {
		req.HashTag = "diff"
	}
	lims := make([]bucket.Limit, n)
	states := make([]bucket.State, n)
	expireAt := make([]int64, n) // Unix ns at which the stored key expires; 0: none stored
	keys := make([]string, n)
	for i := range n {
		lims[i] = randomLimit(r)
		req.Buckets[i].Key = "k" + strconv.Itoa(i)
		keys[i] = storageKey(DefaultKeyPrefix, req.Buckets[i].Key, lims[i].Rate, lims[i].Burst)
	}
	nowUs := t0.UnixMicro()
	costs := make([]float64, n)
	delays := make([]int64, n)
	delayed := 0
	defer func() {
		if delay && delayed == 0 && !t.Failed() {
			t.Error("no decision delayed: the delays go untested")
		}
	}()
	for step := range 250 {
		for i := range n {
			if r.IntN(10) == 0 || step == 0 && delay {
				// The rule changed: another bucket, full (its limit is part
				// of its identity).
				lims[i], states[i], expireAt[i] = randomLimit(r), bucket.State{}, 0
				if delay && r.IntN(3) == 0 {
					lims[i] = smoothLimit(r, lims[i])
				}
				keys[i] = storageKey(DefaultKeyPrefix, req.Buckets[i].Key, lims[i].Rate, lims[i].Burst)
			}
			costs[i] = randomCost(r, lims[i])
			if delay {
				delays[i] = randomDelay(r, lims[i])
			}
			req.Buckets[i].Rate, req.Buckets[i].Burst, req.Buckets[i].Cost, req.Buckets[i].MaxDelayMs = lims[i].Rate, lims[i].Burst, costs[i], delays[i]
		}
		nowUs += randomStep(r, lims[0], costs[0], backwards)
		now := nowUs * 1000
		for i := range n {
			if expireAt[i] != 0 && now >= expireAt[i] {
				states[i], expireAt[i] = bucket.State{}, 0 // Redis forgot it
			}
		}
		m.SetTime(time.UnixMicro(nowUs))
		if testing.Verbose() {
			for i := range n {
				v, _ := c.Get(ctx, keys[i]).Result()
				t.Logf("step %d +%dus: %s = %q, state %+v, cost %g, limit %+v", step, nowUs-t0.UnixMicro(), keys[i], v, states[i], costs[i], lims[i])
			}
		}
		got, err := s.Decide(ctx, req)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if err := checkAgainstBucket(got, lims, states, now, costs, delays); err != nil {
			t.Fatalf("step %d at +%dus: %v", step, nowUs-t0.UnixMicro(), err)
		}
		all, nexts, _ := takeAll(lims, states, now, costs, delays)
		if got.WaitMs > 0 {
			delayed++
		}
		if !all {
			continue
		}
		copy(states, nexts)
		for i := range n {
			full := lims[i].FullAt(states[i])
			if full <= now {
				states[i] = bucket.State{} // full: storage forgets it
			}
			v, err := c.Get(ctx, keys[i]).Result()
			if err == redis.Nil {
				if full > now {
					t.Fatalf("step %d: bucket %d deleted, but it is full only at +%v", step, i, time.Duration(full-now))
				}
				expireAt[i] = 0
				continue
			}
			f := strings.Fields(v) // tokens, time, and the ledger
			if len(f) < 2 {
				t.Fatalf("step %d: bucket %d stored %q", step, i, v)
			}
			if tok, _ := strconv.ParseFloat(f[0], 64); tok != states[i].Tokens || f[1] != strconv.FormatInt(states[i].At/1000, 10) {
				t.Fatalf("step %d: bucket %d stored %q, want tokens %v at %dus", step, i, v, states[i].Tokens, states[i].At/1000)
			}
			pttl := c.PTTL(ctx, keys[i]).Val()
			if backwards {
				continue // keys do not expire in this mode
			}
			expireAt[i] = now + int64(pttl)
			if expireAt[i] < full || expireAt[i] > full+2*int64(time.Millisecond) {
				t.Fatalf("step %d: bucket %d expires in %v, full in %v: want at most 2ms later", step, i, pttl, time.Duration(full-now))
			}
		}
	}
}

func TestRedisMultiBucketAtomic(t *testing.T) {
	_, c, s := newMini(t, RedisOptions{})
	ctx := context.Background()
	req := &wire.Request{HashTag: "user-1", Buckets: []wire.Bucket{
		{Key: "per-second", Rate: 1, Burst: 1, Cost: 1},
		{Key: "per-minute", Rate: 0.05, Burst: 3, Cost: 1},
	}}
	d, err := s.Decide(ctx, req)
	if err != nil || !d.Allowed || d.Buckets[0].Remaining != 0 || d.Buckets[1].Remaining != 2 {
		t.Fatalf("first Decide = %+v, %v; want allowed, remaining 0 and 2", d, err)
	}
	before := c.Get(ctx, "rl:{user-1}:per-minute").Val()
	d, err = s.Decide(ctx, req) // per-second refuses: per-minute must not be consumed
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Buckets[0].Allowed || !d.Buckets[1].Allowed || d.Buckets[1].Remaining != 2 ||
		d.Buckets[1].RetryAfterMs != 0 || d.RetryAfterMs != 1000 {
		t.Fatalf("second Decide = %+v; want refused by bucket 0 only, bucket 1 untouched at 2", d)
	}
	if after := c.Get(ctx, "rl:{user-1}:per-minute").Val(); after != before {
		t.Fatalf("refused request changed per-minute: %q -> %q", before, after)
	}
}

func TestRedisNoScript(t *testing.T) {
	for _, batch := range []int{0, 8} {
		t.Run(fmt.Sprintf("batch%d", batch), func(t *testing.T) {
			_, c, s := newMini(t, RedisOptions{Batch: BatchOptions{MaxSize: batch}})
			ctx := context.Background()
			for i := range 3 {
				if err := c.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if d, err := s.Decide(ctx, one("k", 1, 5, 1)); err != nil || !d.Allowed {
					t.Fatalf("round %d after SCRIPT FLUSH: %+v, %v", i, d, err)
				}
			}
		})
	}
}

func TestRedisMalformedValue(t *testing.T) {
	m, _, s := newMini(t, RedisOptions{})
	if err := m.Set(storageKey(DefaultKeyPrefix, "k", 1, 5), "garbage"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(context.Background(), one("k", 1, 5, 1)); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("Decide on a malformed value: %v, want a malformed-value error", err)
	}
}

// TestRedisLedgerRecords: malformed ledgers are refused, not guessed; the
// record of a limitd before the ledger per caller (eight fields) is read
// with its tokens and its return budget, its callerless reservations
// dropped.
func TestRedisLedgerRecords(t *testing.T) {
	m, _, s := newMini(t, RedisOptions{})
	key := storageKey(DefaultKeyPrefix, "k", 1, 5)
	gen := strconv.FormatInt(t0.UnixMicro()/DefaultLedgerWindow.Microseconds(), 10)
	at := strconv.FormatInt(t0.UnixMicro(), 10)
	for _, v := range []string{
		"1 " + at + " " + gen + " 0 0 gw-a 1 0",       // a caller's part cut short
		"1 " + at + " " + gen + " 0 0 0 gw-a 1 0 x 0", // not a number
		"1 " + at + " " + gen + " 0",                  // no refund budget
		"1 " + at + " " + gen + " 0 0 0 0 x",          // an old record's budget not a number
		"1 " + at + " " + gen + " 0 0 gw-a 1 0 0 0 9", // trailing field
	} {
		if err := m.Set(key, v); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Decide(context.Background(), one("k", 1, 5, 1)); err == nil || !strings.Contains(err.Error(), "malformed") {
			t.Errorf("Decide on %q: %v, want a malformed-value error", v, err)
		}
	}
	// An old record: 2 tokens, 3 granted, 4 reserved, 5 returned this window
	// (the whole budget of a burst of 5).
	if err := m.Set(key, "2 "+at+" "+gen+" 3 0 4 0 5"); err != nil {
		t.Fatal(err)
	}
	c, err := s.Charge(context.Background(), &wire.ChargeRequest{Buckets: []wire.ChargeBucket{{Key: "k", Rate: 1, Burst: 5, Amount: -4}}})
	if err != nil || c.Buckets[0].Applied != 0 || c.Buckets[0].Remaining != 2 {
		t.Fatalf("refund of an old record's reservation = %+v, %v; want nothing back, 2 remaining", c, err)
	}
	if _, err := s.Lease(context.Background(), &wire.LeaseRequest{Buckets: []wire.LeaseBucket{{Key: "k", Rate: 1, Burst: 5, Want: 1, Min: 1}}}); err != nil {
		t.Fatal(err)
	}
	l, err := s.Lease(context.Background(), &wire.LeaseRequest{Buckets: []wire.LeaseBucket{{Key: "k", Rate: 1, Burst: 5, Return: 1}}})
	if err != nil || l.Buckets[0].Returned != 0 {
		t.Fatalf("a return with the old record's budget spent = %+v, %v; want nothing back", l, err)
	}
}

// TestRedisCrossSlotDecided: on a Redis Cluster, a request whose buckets
// fall in different slots is decided (one script per slot), and a refusal
// in one slot gives back what the other took.
func TestRedisCrossSlotDecided(t *testing.T) {
	m := miniredis.RunT(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{m.Addr()}})
	defer cc.Close()
	s, err := NewRedisStore(cc, RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if keySlot(storageKey(DefaultKeyPrefix, "a", 1, 5)) == keySlot(storageKey(DefaultKeyPrefix, "b", 1, 1)) {
		t.Fatal("keys a and b share a slot: pick others")
	}
	ctx := context.Background()
	two := &wire.Request{Buckets: []wire.Bucket{{Key: "a", Rate: 1, Burst: 5, Cost: 1}, {Key: "b", Rate: 1, Burst: 1, Cost: 1}}}
	if d, err := s.Decide(ctx, two); err != nil || !d.Allowed {
		t.Fatalf("Decide = %+v, %v, want admitted", d, err)
	}
	// b is empty now: refused, and a gets its token back.
	if d, err := s.Decide(ctx, two); err != nil || d.Allowed {
		t.Fatalf("Decide = %+v, %v, want refused", d, err)
	}
	d, err := s.Decide(ctx, one("a", 1, 5, 4))
	if err != nil || !d.Allowed || d.Buckets[0].Remaining != 0 {
		t.Fatalf("a after a refused pair = %+v, %v: want 4 left to take (the refused pair's token given back)", d, err)
	}
}

func TestNewRedisStoreRejectsBracePrefix(t *testing.T) {
	if _, err := NewRedisStore(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), RedisOptions{KeyPrefix: "a{"}); err == nil {
		t.Fatal("NewRedisStore accepted a prefix with a brace")
	}
}

// TestRedisBatchHammer runs many concurrent decisions on one bucket through
// the batcher with the clock stopped: exactly burst of them are admitted,
// and pipelines do carry several decisions.
func TestRedisBatchHammer(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, _, s := newMini(t, RedisOptions{Registerer: reg, Batch: BatchOptions{MaxSize: 32, Workers: 2, Timeout: 30 * time.Second}})
	const workers, each, burst = 32, 12, 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range workers {
		wg.Go(func() {
			for range each {
				d, err := s.Decide(context.Background(), one("hot", 0.01, burst, 1))
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if admitted != burst {
		t.Fatalf("admitted %d of %d, want exactly %d", admitted, workers*each, burst)
	}
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %v, %d families", err, len(mfs))
	}
	h := mfs[0].GetMetric()[0].GetHistogram()
	if h.GetSampleCount() == 0 || float64(h.GetSampleSum())/float64(h.GetSampleCount()) <= 1 {
		t.Fatalf("pipelines: %d carrying %v decisions: want batches above 1 on average", h.GetSampleCount(), h.GetSampleSum())
	}
	t.Logf("%d pipelines, %.1f decisions each on average", h.GetSampleCount(), h.GetSampleSum()/float64(h.GetSampleCount()))
}

func TestRedisBatchCanceledCallSkipped(t *testing.T) {
	_, _, s := newMini(t, RedisOptions{Batch: BatchOptions{MaxSize: 8}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Decide(ctx, one("k", 1, 1, 1)); err == nil {
		t.Fatal("Decide with a canceled context succeeded")
	}
	d, err := s.Decide(context.Background(), one("k", 1, 1, 1))
	if err != nil || !d.Allowed {
		t.Fatalf("Decide after a canceled call = %+v, %v; want allowed (nothing consumed)", d, err)
	}
	s.Close()
	if _, err := s.Decide(context.Background(), one("k", 1, 1, 1)); err == nil {
		t.Fatal("Decide after Close succeeded")
	}
}

func TestRedisErrorWhenDown(t *testing.T) {
	m, _, s := newMini(t, RedisOptions{})
	m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := s.Decide(ctx, one("k", 1, 1, 1)); err == nil {
		t.Fatal("Decide with Redis down succeeded")
	}
	if err := s.Ping(ctx); err == nil {
		t.Fatal("Ping with Redis down succeeded")
	}
}
