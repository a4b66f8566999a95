package rlqs

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// plain is envoyproxy/ratelimit's 100 a second without the burst extension:
// a burst of one second of rate.
var plain = Limit{Key: "plain", Rate: 100, Burst: 100}

// step is one moment of an allocator timeline: a holder's report (demand a
// second over interval) or, with release, its stream's end.
type step struct {
	at       time.Duration // from epoch
	h        Holder
	demand   float64
	interval time.Duration
	release  bool
	// What is wanted after the step: the shape's rate and max_tokens within
	// [lo, hi] (rate) and at least minMax; the limit's counted sums.
	rateLo, rateHi float64
	minMax         uint32
	countedRate    float64 // -1: not checked
}

func holderOf(stream uint64, caller string) Holder {
	return Holder{Stream: stream, Caller: caller, Bucket: "k"}
}

// runTimeline plays steps on a, checking each against its wants and every
// step against the invariants.
func runTimeline(t *testing.T, a *Allocator, lim Limit, steps []step) {
	t.Helper()
	for i, s := range steps {
		now := epoch.Add(s.at)
		if s.release {
			a.Release(lim.Key, s.h)
		} else {
			sh, ttl := a.Assign(lim, s.h, s.demand, s.interval, now)
			if r := sh.rate(); r < s.rateLo-1e-9 || r > s.rateHi+1e-9 || sh.max < s.minMax {
				t.Errorf("step %d: Assign(%v, %v/s) at %v = %+v (%.2f/s) ttl %v, want %.2f..%.2f/s and max_tokens >= %d",
					i, s.h.Stream, s.demand, s.at, sh, r, ttl, s.rateLo, s.rateHi, s.minMax)
			}
		}
		r, m, free := a.Counted(lim.Key, now)
		checkSums(t, fmt.Sprintf("step %d", i), lim, r, m, free)
		if s.countedRate >= 0 && math.Abs(r-s.countedRate) > 1e-9 {
			t.Errorf("step %d: counted rate %.2f, want %.2f", i, r, s.countedRate)
		}
	}
}

// checkSums checks the allocator's invariants for lim.
func checkSums(t *testing.T, at string, lim Limit, rate, maxTokens, free float64) {
	t.Helper()
	if rate > lim.Rate*(1-Spare)+1e-9 || maxTokens > lim.Burst+1e-9 || free < -1e-9 || free > lim.Burst+1e-9 {
		t.Fatalf("%s: counted rates %.3f (at most %.3f), max_tokens %.3f (at most %.0f), free %.3f (0..%.0f)",
			at, rate, lim.Rate*(1-Spare), maxTokens, lim.Burst, free, lim.Burst)
	}
}

// A plain limit's lone Envoy, reporting every 5 s, is given nearly all of
// the rate and a TTL of three reports, kept while its demand moves a little;
// a second Envoy gets what the first's commitments leave, and the whole of
// its fair half once the first's larger assignment has lapsed; an ended
// stream's commitment is counted until its TTL and grace have passed.
func TestAllocatorTimeline(t *testing.T) {
	a := NewAllocator(AllocOptions{})
	A, B := holderOf(1, "x"), holderOf(2, "y")
	s := 5 * time.Second
	full := plain.Rate * (1 - Spare)
	runTimeline(t, a, plain, []step{
		{at: 0, h: A, demand: 1, rateLo: full * (1 - Headroom), rateHi: full, minMax: 4, countedRate: -1},
		{at: 5 * time.Second, h: A, demand: 20, interval: s, rateLo: full * (1 - Headroom), rateHi: full, minMax: 40, countedRate: -1},
		// B asks the whole rate: it gets what A's commitment leaves.
		{at: 6 * time.Second, h: B, demand: 200, interval: s, rateLo: 0, rateHi: full * 0.3, countedRate: -1},
		// A's share shrinks to its demand's; its old commitment stays counted.
		{at: 10 * time.Second, h: A, demand: 20, interval: s, rateLo: 30, rateHi: 60, countedRate: -1},
		{at: 15 * time.Second, h: A, demand: 20, interval: s, rateLo: 30, rateHi: 60, countedRate: -1},
		{at: 20 * time.Second, h: A, demand: 20, interval: s, rateLo: 30, rateHi: 60, countedRate: -1},
		// A's first assignment (sent at 5 s, TTL 15 s + 1 s) has lapsed: B grows.
		{at: 21 * time.Second, h: B, demand: 200, interval: s, rateLo: full - 60, rateHi: full - 30, countedRate: -1},
		// A's stream ends: its commitment (last sent at 20 s) counts until 36 s.
		{at: 22 * time.Second, h: A, release: true, countedRate: -1},
		{at: 35 * time.Second, h: B, demand: 200, interval: s, rateLo: full - 60, rateHi: full - 30, countedRate: -1},
		{at: 37 * time.Second, h: B, demand: 200, interval: s, rateLo: full * 0.9, rateHi: full, countedRate: -1},
	})
}

// Whatever holders report, in whatever order, with streams ending, clocks
// standing still and limits reloaded, the counted rates stay within the
// rate less Spare, the counted max_tokens within the burst, and the free
// tokens within 0 and the burst.
func TestAllocatorInvariants(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 39))
		a := NewAllocator(AllocOptions{Replicas: 1 + int(seed%3)})
		lim := Limit{Key: "k", Rate: 1 + rng.Float64()*200, Burst: 1 + rng.Float64()*400}
		now, reloaded := epoch, epoch.Add(-time.Hour)
		checked := 0
		for i := range 2000 {
			now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
			h := holderOf(uint64(rng.IntN(12)), []string{"a", "b", "c"}[rng.IntN(3)])
			switch rng.IntN(200) {
			case 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19:
				a.Release(lim.Key, h)
			case 20: // a reload
				reloaded = now
				lim.Rate, lim.Burst = 1+rng.Float64()*200, 1+rng.Float64()*400
			default:
				a.Assign(lim, h, rng.Float64()*300, time.Duration(rng.IntN(6))*time.Second, now)
			}
			r, m, free := a.Counted(lim.Key, now)
			part := Limit{Rate: lim.Rate / float64(a.opts.Replicas), Burst: lim.Burst / float64(a.opts.Replicas)}
			if now.Sub(reloaded) <= 20*time.Second { // commitments (TTL 15 s + grace at most here) made under the old limit may exceed the new one
				continue
			}
			checkSums(t, fmt.Sprintf("seed %d op %d", seed, i), part, r, m, free)
			checked++
		}
		if checked < 1000 {
			t.Errorf("seed %d: %d of 2000 steps checked", seed, checked)
		}
	}
}

// A caller churning holders on one limit (each reports once, then its
// stream ends) is held to maxCallerGrants holders there, ended ones
// included, whatever the churn; another caller's new holder is still
// assigned its share.
func TestAllocatorChurnBounded(t *testing.T) {
	a := NewAllocator(AllocOptions{})
	now := epoch
	for i := range 20000 {
		h := holderOf(uint64(i), "churner")
		a.Assign(plain, h, 1000, envoyEvery, now)
		a.Release(plain.Key, h)
		if i%100 == 99 {
			now = now.Add(100 * time.Millisecond)
		}
	}
	if n := len(a.ledgers[plain.Key].grants); n > 4*MaxStreamsPerCaller {
		t.Fatalf("%d holders kept after 20,000 churned, want at most %d", n, 4*MaxStreamsPerCaller)
	}
	h := holderOf(1<<40, "honest")
	sh, _ := a.Assign(plain, h, 100, envoyEvery, now)
	for range 8 { // its share once the churner's assignments lapse
		now = now.Add(envoyEvery)
		sh, _ = a.Assign(plain, h, 100, envoyEvery, now)
	}
	if sh.rate() < 0.4*plain.Rate {
		t.Errorf("the honest holder beside the churner: %+v (%.1f/s), want at least 40%% of the rate", sh, sh.rate())
	}
	t.Logf("after 20,000 churned holders: %d kept; the honest one %.1f/s, max_tokens %d", len(a.ledgers[plain.Key].grants), sh.rate(), sh.max)
}
