package bucket

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestReserve is a timeline at 10 tokens per second, burst 1, waiting up to
// one second: the first request goes at once, the next ten take their
// tokens now and wait 100 ms apart, the twelfth would wait past the bound
// and is refused with Take's Retry-After, leaving the bucket as it was.
func TestReserve(t *testing.T) {
	lim := Limit{Rate: 10, Burst: 1}
	var s State
	for i := range 12 {
		next, d := lim.Reserve(s, t0, 1, time.Second)
		switch {
		case i == 0:
			if !d.Allowed || d.Wait != 0 {
				t.Fatalf("request 0: %+v, want allowed at once", d)
			}
		case i <= 10:
			if want := time.Duration(i) * 100 * time.Millisecond; !d.Allowed || d.Wait != want || d.RetryAfter != 0 || d.Remaining != 0 {
				t.Fatalf("request %d: %+v, want allowed after %v", i, d, want)
			}
		default:
			if d.Allowed || d.Wait != 0 || next != s {
				t.Fatalf("request %d: %+v, state %+v; want refused, state unchanged", i, d, next)
			}
			// Take's answer from the same debt: 10 tokens owed, one more wanted.
			if _, td := lim.Take(s, t0, 1); d != td || (d.RetryAfter+time.Millisecond-1)/time.Millisecond != 1100 {
				t.Fatalf("request %d: %+v, want Take's %+v with a Retry-After of 1.1s", i, d, td)
			}
		}
		s = next
	}
	// The debt is paid at the rate: at t5 the sixth waiter's tokens are
	// there, so a new request waits for the eleventh's plus its own.
	if _, d := lim.Reserve(s, t5, 1, time.Second); !d.Allowed || d.Wait != 600*time.Millisecond {
		t.Fatalf("at t5: %+v, want a wait of 600ms", d)
	}
	// A give-up returns its tokens only when no one took tokens after it:
	// the last holder's come back whole, the first's not at all (the nine
	// after it keep their moments).
	if back := lim.Cancel(s, t0, 1, t0+sec); back.Tokens != s.Tokens+1 {
		t.Fatalf("last holder's give-up: %+v, want one token back to %+v", back, s)
	}
	if back := lim.Cancel(s, t0, 1, t1); back.Tokens != s.Tokens {
		t.Fatalf("first holder's give-up: %+v, want nothing back to %+v", back, s)
	}
	if back := lim.Cancel(s, t1, 1, t1); back != lim.Refund(s, t1, 1) {
		t.Fatalf("give-up once gone on: %+v, want Refund", back)
	}
}

func TestReserveEdges(t *testing.T) {
	lim := Limit{Rate: 10, Burst: 5}
	full := State{}
	empty := State{Tokens: 0, At: t0}
	for _, tt := range []struct {
		name     string
		s        State
		cost     float64
		maxWait  time.Duration
		wantOK   bool
		wantWait time.Duration
	}{
		{"no wait allowed is Take", empty, 1, 0, false, 0},
		{"negative wait is Take", empty, 1, -time.Second, false, 0},
		{"tokens there", full, 5, time.Second, true, 0},
		{"cost above burst", empty, 6, time.Hour, false, 0},
		{"NaN cost", empty, math.NaN(), time.Second, false, 0},
		{"zero cost", empty, 0, time.Second, true, 0},
		{"fraction", empty, 0.5, time.Second, true, 50 * time.Millisecond},
		{"exactly the bound", empty, 5, 500 * time.Millisecond, true, 500 * time.Millisecond},
		{"a nanosecond past", empty, 5, 500*time.Millisecond - 1, false, 0},
		{"bound clamped to MaxWait", State{Tokens: -600, At: t0}, 1, time.Hour, false, 0},
		{"deep within MaxWait", State{Tokens: -500, At: t0}, 1, time.Hour, true, 50*time.Second + 100*time.Millisecond},
	} {
		next, d := lim.Reserve(tt.s, t0, tt.cost, tt.maxWait)
		if d.Allowed != tt.wantOK || d.Wait != tt.wantWait {
			t.Errorf("%s: Reserve = %+v, want allowed %v wait %v", tt.name, d, tt.wantOK, tt.wantWait)
		}
		if !d.Allowed && next != tt.s {
			t.Errorf("%s: refused but the state changed: %+v", tt.name, next)
		}
		if tt.maxWait <= 0 {
			if tn, td := lim.Take(tt.s, t0, tt.cost); tn != next || td != d {
				t.Errorf("%s: Reserve = %+v %+v, Take = %+v %+v", tt.name, next, d, tn, td)
			}
		}
	}
	// A clock gone backwards: the wait counts the gap back to the state's
	// time, when the refill resumes.
	if _, d := lim.Reserve(State{Tokens: 0, At: t1}, t0, 1, time.Second); !d.Allowed || d.Wait != 200*time.Millisecond {
		t.Errorf("clock back: %+v, want a wait of 200ms", d)
	}
	// A charge leaves a reservation's deeper debt where it was.
	deep := State{Tokens: -8, At: t0}
	if got := lim.Charge(deep, t0, 3); got != deep {
		t.Errorf("Charge on a reservation's debt = %+v, want %+v", got, deep)
	}
	if got := lim.Charge(deep, t0, -3); got.Tokens != -5 {
		t.Errorf("refund by Charge = %+v, want -5 tokens", got)
	}
}

// TestPropertyReserveWithinBound: random arrivals, costs, bounds and
// give-ups (refunds before the wait ends). Counting each admitted request at
// the moment it goes on (its take plus its wait), the cost going on over any
// interval [a, b] never exceeds Burst + Rate × (b − a) (plus the slack), no
// wait exceeds its bound, and waits end in the order the tokens were taken.
func TestPropertyReserveWithinBound(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 34))
		lim := Limit{Rate: 1 + r.Float64()*50, Burst: 1 + r.Float64()*20}
		lim.Burst = max(lim.Burst, lim.Rate/10)
		type goes struct {
			at   int64
			cost float64
		}
		type giveUp struct {
			at, goesAt int64
			cost       float64
		}
		var s State
		var out []goes
		var pending []giveUp // in the order of their moments
		now := t0
		lastEnd := int64(0)
		for range 400 {
			now += r.Int64N(int64(200 * time.Millisecond))
			// Give-ups due by now happen first, in time order, so the
			// bucket's time is the arrivals' time.
			for len(pending) > 0 && pending[0].at <= now {
				g := pending[0]
				pending = pending[1:]
				s = lim.Cancel(s, g.at, g.cost, g.goesAt)
			}
			cost := float64(1 + r.IntN(3))
			if r.IntN(4) == 0 {
				cost = r.Float64() * lim.Burst
			}
			maxWait := time.Duration(r.Int64N(int64(2 * time.Second)))
			next, d := lim.Reserve(s, now, cost, maxWait)
			if !d.Allowed {
				continue
			}
			if d.Wait > maxWait {
				t.Fatalf("seed %d: wait %v past its bound %v", seed, d.Wait, maxWait)
			}
			end := now + int64(d.Wait)
			if end+2 < lastEnd && d.Wait > 0 { // up to rounding to whole nanoseconds
				t.Fatalf("seed %d: a later reservation (%v, cost %v, wait %v, state %+v) ends at %v, before %v", seed, at(now), cost, d.Wait, s, at(end), at(lastEnd))
			}
			s = next
			if d.Wait > 0 && r.IntN(5) == 0 {
				// Gives up partway through its wait.
				g := giveUp{now + r.Int64N(int64(d.Wait)), end, cost}
				i := len(pending)
				for i > 0 && pending[i-1].at > g.at {
					i--
				}
				pending = append(pending[:i], append([]giveUp{g}, pending[i:]...)...)
				continue
			}
			lastEnd = max(lastEnd, end)
			out = append(out, goes{end, cost})
		}
		// Sort by the moment each goes on (insertion sort: nearly ordered).
		for i := 1; i < len(out); i++ {
			for j := i; j > 0 && out[j].at < out[j-1].at; j-- {
				out[j], out[j-1] = out[j-1], out[j]
			}
		}
		for i := range out {
			sum := 0.0
			for j := i; j < len(out); j++ {
				sum += out[j].cost
				span := float64(out[j].at-out[i].at) / 1e9
				if bound := lim.Burst + lim.Rate*span + float64(j-i+1)*(lim.slack()+2e-12*lim.Burst); sum > bound+1e-9 {
					t.Fatalf("seed %d: %v going on over [%v, %v], bound %v", seed, sum, at(out[i].at), at(out[j].at), bound)
				}
			}
		}
	}
}
