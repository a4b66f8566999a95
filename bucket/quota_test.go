package bucket

import (
	"math"
	"math/rand"
	"testing"
	"time"
)

// quota is a quota of burst over the period [start, end) (Unix ns).
func quota(burst float64, start, end int64) Limit {
	return Limit{Burst: burst, PeriodStart: start, PeriodEnd: end}
}

// TestQuotaTimeline: a quota of 3 a period of 10 s; no refill within the
// period, full again at the boundary with its debt forgiven, the waits to the
// boundary.
func TestQuotaTimeline(t *testing.T) {
	const s = int64(time.Second)
	p1, p2 := quota(3, 10*s, 20*s), quota(3, 20*s, 30*s)
	type step struct {
		lim       Limit
		op        string // take, charge, refund
		at        int64
		n         float64
		wantOK    bool
		wantLeft  int64
		wantRetry time.Duration
		wantReset time.Duration
	}
	steps := []step{
		{p1, "take", 11 * s, 1, true, 2, 0, 9 * time.Second},
		{p1, "take", 15 * s, 2, true, 0, 0, 5 * time.Second},
		{p1, "take", 19 * s, 1, false, 0, time.Second, time.Second}, // no refill within the period
		{p1, "charge", 19 * s, 2, true, 0, 0, time.Second},          // debt of 2
		{p1, "take", 19*s + 999_999_999, 1, false, 0, 1, 1},
		{p2, "take", 20 * s, 3, true, 0, 0, 10 * time.Second}, // a new period: full, debt forgiven
		{p2, "take", 21 * s, 1, false, 0, 9 * time.Second, 9 * time.Second},
		{p2, "refund", 22 * s, 1, true, 1, 0, 8 * time.Second},
		{p2, "take", 22 * s, 4, false, 1, 8 * time.Second, 8 * time.Second}, // above the limit: never
	}
	var st State
	for i, c := range steps {
		var d Decision
		switch c.op {
		case "take":
			var next State
			next, d = c.lim.Take(st, c.at, c.n)
			if !d.Allowed && next != st {
				t.Fatalf("step %d: a refused Take changed the state", i)
			}
			st = next
		case "charge":
			st = c.lim.Charge(st, c.at, c.n)
			d = c.lim.ReportAt(c.lim.Tokens(st, c.at), c.at, 0, 0, true)
		case "refund":
			st = c.lim.Refund(st, c.at, c.n)
			d = c.lim.ReportAt(c.lim.Tokens(st, c.at), c.at, 0, 0, true)
		}
		if d.Allowed != c.wantOK || d.Remaining != c.wantLeft || d.RetryAfter != c.wantRetry || d.ResetAfter != c.wantReset {
			t.Fatalf("step %d: %s(%v, %v) = %+v, want allowed %v remaining %d retry %v reset %v", i, c.op, c.at, c.n, d,
				c.wantOK, c.wantLeft, c.wantRetry, c.wantReset)
		}
	}
	if got := p2.FullAt(st); got != 30*s {
		t.Fatalf("FullAt of a used quota = %d, want the boundary %d", got, 30*s)
	}
	if got := p2.Tokens(st, 30*s); got != 3 {
		t.Fatalf("Tokens at the boundary = %v, want 3", got)
	}
}

// TestQuotaProperties runs random takes, reservations, charges, refunds and
// leases over consecutive periods of random quotas and checks: within each
// period the admitted cost less refunds is at most Burst, and admitted plus charged less
// refunded at most 2 × Burst (one overshoot from charges); a refused request
// changes nothing and waits exactly until the boundary; a greedy client is
// refused only once the period's Burst is spent; every period starts full.
func TestQuotaProperties(t *testing.T) {
	r := rand.New(rand.NewSource(41))
	for trial := 0; trial < 300; trial++ {
		burst := math.Pow(10, 6*r.Float64())
		if r.Intn(2) == 0 {
			burst = math.Ceil(burst)
		}
		var st State
		start := int64(1_700_000_000) * 1e9
		for period := 0; period < 8; period++ {
			length := int64(1+r.Intn(3600)) * 1e9
			lim := quota(burst, start, start+length)
			if got := lim.Tokens(st, start); got != burst {
				t.Fatalf("trial %d period %d: a new period holds %v, want Burst %v", trial, period, got, burst)
			}
			admitted, refunded, net := 0.0, 0.0, 0.0
			now := start
			for i := 0; i < 60; i++ {
				now = min(now+r.Int63n(length/30+1), start+length-1)
				cost := burst * 0.3 * r.Float64()
				before := lim.Tokens(st, now)
				switch r.Intn(6) {
				case 0, 1:
					next, d := lim.Take(st, now, cost)
					if d.Allowed {
						admitted += cost
						net += cost
					} else {
						if next != st {
							t.Fatalf("trial %d: a refused Take changed the state", trial)
						}
						if before+lim.slack() >= cost {
							t.Fatalf("trial %d: refused %v with %v tokens", trial, cost, before)
						}
						if d.RetryAfter != time.Duration(start+length-now) {
							t.Fatalf("trial %d: RetryAfter %v, want the boundary %v", trial, d.RetryAfter, time.Duration(start+length-now))
						}
					}
					st = next
				case 2:
					next, d := lim.Reserve(st, now, cost, time.Second)
					if d.Wait != 0 {
						t.Fatalf("trial %d: a quota reservation waits %v: there is no refill to wait for", trial, d.Wait)
					}
					if d.Allowed {
						admitted += cost
						net += cost
					}
					st = next
				case 3:
					st = lim.Charge(st, now, cost)
					net += before - lim.Tokens(st, now)
				case 4:
					st = lim.Refund(st, now, cost)
					net -= lim.Tokens(st, now) - before
					refunded += lim.Tokens(st, now) - before
				case 5:
					next, granted, ok, _ := lim.Lease(st, now, 0, cost, cost/2)
					if ok {
						admitted += granted
						net += granted
					}
					st = next
				}
				if tok := lim.Tokens(st, now); tok < -burst || tok > burst {
					t.Fatalf("trial %d: tokens %v outside [−Burst, Burst]", trial, tok)
				}
			}
			if admitted-refunded > burst*(1+1e-9) || net > 2*burst*(1+1e-9) {
				t.Fatalf("trial %d period %d: admitted %v, refunded %v, net %v, burst %v", trial, period, admitted, refunded, net, burst)
			}
			// The reset is the boundary, whatever is left.
			left := lim.Tokens(st, now)
			if d := lim.ReportAt(left, now, 0, 0, true); d.ResetAfter != time.Duration(start+length-now) {
				t.Fatalf("trial %d: ResetAfter %v, want the boundary", trial, d.ResetAfter)
			}
			start += length
		}
	}
}

// TestQuotaGreedy: a client taking 1 at every nanosecond of its choosing is
// admitted exactly floor(Burst) times a period, whatever the period's length.
func TestQuotaGreedy(t *testing.T) {
	for _, burst := range []float64{1, 7, 100, 1000.5} {
		var st State
		start := int64(5e18)
		for period := 0; period < 3; period++ {
			lim := quota(burst, start, start+int64(time.Hour))
			n := 0
			for i := 0; i < 2000; i++ {
				var d Decision
				st, d = lim.Take(st, start+int64(i), 1)
				if d.Allowed {
					n++
				}
			}
			if n != int(burst) {
				t.Fatalf("burst %v period %d: admitted %d, want %d", burst, period, n, int(burst))
			}
			start += int64(time.Hour)
		}
	}
}

// TestQuotaIsNotABucket: PeriodEnd makes a quota only with Rate 0; with a
// rate the Limit is an ordinary token bucket, and PeriodStart alone changes
// nothing.
func TestQuotaIsNotABucket(t *testing.T) {
	if (Limit{Rate: 1, Burst: 1, PeriodEnd: 10}).Quota() || (Limit{Burst: 1, PeriodStart: 5}).Quota() || !quota(1, 0, 1).Quota() {
		t.Fatal("Quota() disagrees with PeriodEnd > 0 and Rate 0")
	}
	a, b := Limit{Rate: 2, Burst: 4}, Limit{Rate: 2, Burst: 4, PeriodStart: 1, PeriodEnd: 1e9}
	s, _ := a.Take(State{}, 5e8, 3)
	if _, da := a.Take(s, 6e8, 2); true {
		if _, db := b.Take(s, 6e8, 2); da != db {
			t.Fatalf("a rate with a period: %+v, without: %+v", db, da)
		}
	}
}
