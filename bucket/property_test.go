package bucket

import (
	"math"
	"math/big"
	"math/rand"
	"testing"
	"time"
)

// randomLimit draws rates over nine orders of magnitude and bursts from a
// tenth of a second's refill to eleven days' worth (integers half the time).
func randomLimit(r *rand.Rand) Limit {
	rate := math.Pow(10, -3+9*r.Float64())
	burst := rate * math.Pow(10, -1+7*r.Float64())
	if r.Intn(2) == 0 {
		rate, burst = math.Ceil(rate), math.Ceil(burst)
	}
	return Limit{Rate: rate, Burst: burst}
}

// randomCost is mostly within the burst, sometimes above it, sometimes whole.
func randomCost(r *rand.Rand, lim Limit) float64 {
	c := lim.Burst * 1.1 * r.Float64()
	switch r.Intn(4) {
	case 0:
		c = math.Ceil(c)
	case 1:
		c = lim.Burst
	}
	return max(c, 1e-6)
}

// randomGap is often zero, usually around one request's refill time, now and
// then long enough to refill the bucket, and sometimes negative (the clock
// going backwards).
func randomGap(r *rand.Rand, lim Limit, cost float64) int64 {
	unit := cost / lim.Rate * 1e9
	switch r.Intn(10) {
	case 0, 1, 2:
		return 0
	case 3:
		return int64(lim.Burst / lim.Rate * 1e9 * 2 * r.Float64())
	case 4:
		return -int64(unit * 3 * r.Float64())
	default:
		return int64(unit * 2 * r.Float64())
	}
}

// earliest returns the first time at or after from at which lim admits cost
// on s, found by bisection: the greediest client possible. It returns from
// when no admission comes within RetryAfter.
func earliest(lim Limit, s State, from int64, cost float64) int64 {
	_, d := lim.Take(s, from, cost)
	if d.Allowed {
		return from
	}
	hi, ok := later(from, d.RetryAfter)
	if !ok {
		return from
	}
	if _, d := lim.Take(s, hi, cost); !d.Allowed {
		return from
	}
	lo := from // lo rejected, hi admitted
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if _, d := lim.Take(s, mid, cost); d.Allowed {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// later returns now + d, and false if that overflows.
func later(now int64, d time.Duration) (int64, bool) {
	if int64(d) > math.MaxInt64-now {
		return 0, false
	}
	return now + int64(d), true
}

// pacer yields the times of a client sending cost c every c/rate seconds,
// starting at 0, rounded to whole nanoseconds. It keeps the schedule as whole
// nanoseconds plus a fraction, and the step as a float64 pair (hi + lo), so
// its own error stays far below a nanosecond over millions of steps.
type pacer struct {
	whole, stepWhole int64
	frac, stepFrac   float64
}

func newPacer(cost, rate float64) *pacer {
	x := cost * 1e9
	hi := x / rate
	lo := (math.FMA(-hi, rate, x) + math.FMA(cost, 1e9, -x)) / rate // hi + lo = cost·1e9/rate
	p := &pacer{stepWhole: int64(math.Floor(hi)), stepFrac: hi - math.Floor(hi) + lo}
	p.frac = -p.stepFrac // so that the first call yields 0
	p.whole = -p.stepWhole
	return p
}

// next advances one step and returns the time rounded by mode: "floor",
// "round" or "ceil".
func (p *pacer) next(mode string) int64 {
	p.whole += p.stepWhole
	p.frac += p.stepFrac
	n := math.Floor(p.frac)
	p.whole += int64(n)
	p.frac -= n
	switch {
	case mode == "ceil" && p.frac > 0, mode == "round" && p.frac >= 0.5:
		return p.whole + 1
	}
	return p.whole
}

func TestPacer(t *testing.T) {
	// The pacer's schedule against exact rational arithmetic.
	r := rand.New(rand.NewSource(1))
	for range 100 {
		lim := randomLimit(r)
		cost := lim.Burst * r.Float64()
		p := newPacer(cost, lim.Rate)
		step := new(big.Rat).Quo(new(big.Rat).Mul(new(big.Rat).SetFloat64(cost), big.NewRat(1e9, 1)), new(big.Rat).SetFloat64(lim.Rate))
		for k := range int64(20000) {
			got := p.next("floor")
			if k%101 != 0 {
				continue
			}
			exact := new(big.Rat).Mul(step, big.NewRat(k, 1))
			floor := new(big.Int).Quo(exact.Num(), exact.Denom())
			if want := floor.Int64(); got != want {
				t.Fatalf("pacer(cost %v, rate %v) step %d = %d, want %d", cost, lim.Rate, k, got, want)
			}
		}
	}
}

// slackPerTake is the documented bound on what one admission may take beyond
// the exact model.
func slackPerTake(lim Limit) float64 { return lim.Rate*1e-9 + 2e-12*lim.Burst }

func TestPropertyAdmittedWithinBound(t *testing.T) {
	// Over every interval [ti, tj] between two admissions, the cost admitted
	// is at most burst + rate × (tj − ti), plus the per-take slack. Times are
	// the clock as the bucket sees it, State.At, which never goes back: an
	// admission while the clock is behind counts at the state's time. A third
	// of the requests come at the earliest nanosecond they can be admitted.
	for seed := int64(1); seed <= 300; seed++ {
		r := rand.New(rand.NewSource(seed))
		lim := randomLimit(r)
		s := State{}
		now := t0
		// For admissions 1..j: sum is P[j]; bound checking keeps the
		// minimum over i <= j of P[i-1] − rate × ti − slack × (i−1).
		sum, admitted := 0.0, 0
		minQ := math.Inf(1)
		slack := slackPerTake(lim)
		for range 2000 {
			cost := randomCost(r, lim)
			if r.Intn(3) == 0 {
				now = earliest(lim, s, now, cost)
			} else {
				now += randomGap(r, lim, cost)
			}
			var d Decision
			s, d = lim.Take(s, now, cost)
			if !d.Allowed {
				continue
			}
			if s.At < now {
				t.Fatalf("seed %d: admitted at %d, but the state's time is %d", seed, now, s.At)
			}
			tsec := float64(s.At-t0) / 1e9
			minQ = min(minQ, sum-lim.Rate*tsec-slack*float64(admitted))
			sum += cost
			admitted++
			excess := sum - lim.Rate*tsec - slack*float64(admitted) - minQ
			if tol := 1e-12*lim.Burst + 1e-11*sum; excess > lim.Burst+tol {
				t.Fatalf("seed %d, %+v: admitted %v beyond burst + rate × elapsed + slack in an interval ending at take %d",
					seed, lim, excess-lim.Burst, admitted)
			}
		}
	}
}

func TestPropertyPacedClientNeverRejected(t *testing.T) {
	// A client sending cost c at t0 + k·c/rate seconds, its times rounded to
	// whole nanoseconds (down, to nearest or up), starting from a bucket that
	// holds at least c, is never rejected.
	for seed := int64(1); seed <= 300; seed++ {
		r := rand.New(rand.NewSource(seed))
		lim := randomLimit(r)
		cost := lim.Burst * (0.01 + 0.99*r.Float64())
		switch r.Intn(3) {
		case 0:
			cost = lim.Burst // the tightest case: no spare tokens at all
		case 1:
			cost = max(1, math.Floor(cost))
			lim.Burst = max(lim.Burst, cost)
		}
		start := State{Tokens: cost + (lim.Burst-cost)*r.Float64(), At: t0}
		if r.Intn(4) == 0 {
			start = State{}
		}
		for _, mode := range []string{"floor", "round", "ceil"} {
			s := start
			p := newPacer(cost, lim.Rate)
			for k := range 3000 {
				now := t0 + p.next(mode)
				var d Decision
				s, d = lim.Take(s, now, cost)
				if !d.Allowed {
					t.Fatalf("seed %d, %+v, cost %v, times rounded by %s: request %d at t0+%dns rejected with %v tokens",
						seed, lim, cost, mode, k, now-t0, lim.Tokens(s, now))
				}
			}
		}
	}
}

func TestPropertyWaitsAreHonest(t *testing.T) {
	// After a rejection, the same request is admitted RetryAfter later (give
	// or take a microsecond of float64 rounding in the tokens), and not
	// sooner than the slack's one nanosecond of refill allows; after any decision the bucket is full
	// ResetAfter later, and not a nanosecond sooner; FullAt is exact;
	// Remaining is the largest whole cost admitted now.
	for seed := int64(1); seed <= 300; seed++ {
		r := rand.New(rand.NewSource(seed))
		lim := randomLimit(r)
		s, now := State{}, t0
		for range 500 {
			cost := randomCost(r, lim)
			now += randomGap(r, lim, cost)
			next, d := lim.Take(s, now, cost)
			if retry, ok := later(now, d.RetryAfter); ok && !d.Allowed && cost <= lim.Burst {
				if _, d2 := lim.Take(s, retry+int64(time.Microsecond), cost); !d2.Allowed {
					t.Fatalf("seed %d, %+v: Take(%+v, %d, %v) said retry after %v, but then: %+v",
						seed, lim, s, now, cost, d.RetryAfter, d2)
				}
				if d.RetryAfter > 2 {
					if _, d2 := lim.Take(s, retry-2, cost); d2.Allowed {
						t.Fatalf("seed %d, %+v: Take(%+v, %d, %v) said retry after %v, but admitted two nanoseconds sooner",
							seed, lim, s, now, cost, d.RetryAfter)
					}
				}
			}
			if reset, ok := later(now, d.ResetAfter); ok {
				if got := lim.Tokens(next, reset); got != lim.Burst {
					t.Fatalf("seed %d, %+v: %+v said reset after %v, but then tokens = %v", seed, lim, d, d.ResetAfter, got)
				}
				if d.ResetAfter > 0 {
					if got := lim.Tokens(next, reset-1); got == lim.Burst {
						t.Fatalf("seed %d, %+v: %+v said reset after %v, but full a nanosecond sooner", seed, lim, d, d.ResetAfter)
					}
				}
			}
			if full := lim.FullAt(next); lim.Tokens(next, full) != lim.Burst || (full > next.At && lim.Tokens(next, full-1) == lim.Burst) {
				t.Fatalf("seed %d, %+v: FullAt(%+v) = %d is not the first full moment", seed, lim, next, full)
			}
			if _, d2 := lim.Take(next, now, float64(d.Remaining)); !d2.Allowed {
				t.Fatalf("seed %d, %+v: Remaining %d, but a take of that much is rejected", seed, lim, d.Remaining)
			}
			if _, d2 := lim.Take(next, now, float64(d.Remaining+1)); d2.Allowed {
				t.Fatalf("seed %d, %+v: Remaining %d, but a take of one more is admitted", seed, lim, d.Remaining)
			}
			s = next
		}
	}
}

func TestPropertyRefundWithinBurst(t *testing.T) {
	// Takes and refunds in any order keep the tokens within [0, burst], and a
	// state that always re-encodes.
	for seed := int64(1); seed <= 300; seed++ {
		r := rand.New(rand.NewSource(seed))
		lim := randomLimit(r)
		s, now := State{}, t0
		for range 500 {
			cost := randomCost(r, lim)
			now += randomGap(r, lim, cost)
			if r.Intn(3) == 0 {
				s = lim.Refund(s, now, cost*3*r.Float64())
			} else {
				s, _ = lim.Take(s, now, cost)
			}
			if got := lim.Tokens(s, now); !(got >= 0 && got <= lim.Burst) || s.Tokens > lim.Burst {
				t.Fatalf("seed %d, %+v: state %+v holds %v tokens at %d, outside [0, burst]", seed, lim, s, got, now)
			}
			if _, err := DecodeState(s.AppendBinary(nil)); err != nil {
				t.Fatalf("seed %d, %+v: state %+v does not re-encode: %v", seed, lim, s, err)
			}
		}
	}
}
