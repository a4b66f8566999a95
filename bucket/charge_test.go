package bucket

import (
	"math"
	"math/rand"
	"testing"
	"time"
)

// chargeStep is one step of a timeline with costs known after admission:
// Take reserves reserve tokens at at; if admitted, Charge adds charge
// (the real cost less the reservation) at the same moment.
type chargeStep struct {
	at          int64
	reserve     float64
	charge      float64
	wantOK      bool
	wantTokens  float64 // after the step
	wantRetrySe int64   // RetryAfter in whole seconds when rejected
}

func runCharges(t *testing.T, lim Limit, s State, steps []chargeStep) State {
	t.Helper()
	for i, st := range steps {
		next, d := lim.Take(s, st.at, st.reserve)
		if d.Allowed != st.wantOK {
			t.Fatalf("step %d: Take(%v, %v) allowed = %v, want %v (%+v)", i, at(st.at), st.reserve, d.Allowed, st.wantOK, d)
		}
		if !d.Allowed && ceilSec(d.RetryAfter) != st.wantRetrySe {
			t.Errorf("step %d: Take(%v, %v) RetryAfter = %v, want %d s", i, at(st.at), st.reserve, d.RetryAfter, st.wantRetrySe)
		}
		if d.Allowed {
			next = lim.Charge(next, st.at, st.charge)
		}
		if got := lim.Tokens(next, st.at); math.Abs(got-st.wantTokens) > 1e-9 {
			t.Errorf("step %d: tokens after %v = %v, want %v", i, at(st.at), got, st.wantTokens)
		}
		s = next
	}
	return s
}

func TestChargeTimeline(t *testing.T) {
	// A budget of 100 refilled at 10 tokens per second; every request
	// reserves 30 and costs 30 (no adjustment): 3 pass, the 4th finds 10.
	lim := Limit{Rate: 10, Burst: 100}
	runCharges(t, lim, State{}, []chargeStep{
		{t0, 30, 0, true, 70, 0},
		{t0, 30, 0, true, 40, 0},
		{t0, 30, 0, true, 10, 0},
		{t0, 30, 0, false, 10, 2}, // needs 20 more: 2 s
	})
	// Reserving 1 while the real cost is 30 (cost_source response_*):
	// exactly 4 requests pass before a rejection, the 4th driving the
	// bucket into debt.
	s := runCharges(t, lim, State{}, []chargeStep{
		{t0, 1, 29, true, 70, 0},
		{t0, 1, 29, true, 40, 0},
		{t0, 1, 29, true, 10, 0},
		{t0, 1, 29, true, -20, 0}, // admitted with 10 left, charged into debt
		{t0, 1, 0, false, -20, 3}, // 21 tokens short: 2.1 s, shown as 3
		{t2, 1, 0, false, -18, 2}, // 200 ms of refill paid 2 of the debt
		{t0 + 2100*ms, 1, 0, true, 0, 0},
	})
	if got := lim.Tokens(s, t0+2100*ms); got != 0 {
		t.Errorf("tokens = %v, want 0", got)
	}
	// The debt stops at −burst: a charge of 1000 into a bucket of 100.
	runCharges(t, lim, State{}, []chargeStep{
		{t0, 1, 999, true, -100, 0},
		{t0 + 10*sec, 1, 0, false, 0, 1},       // the debt is paid back, 1 token short
		{t0 + 20*sec, 1, 0, true, 99, 0},       // full again after 20 s, then one taken
		{t0 + 20*sec, 50, -49, true, 98, 0},    // reserved 50, cost 1: refunded 49
		{t0 + 20*sec, 50, -100, true, 100, 0},  // a refund never goes above burst
		{t0 + 20*sec, 100, 1e9, true, -100, 0}, // nor a debit below −burst
	})
}

func TestChargeEdges(t *testing.T) {
	lim := Limit{Rate: 10, Burst: 100}
	s := State{Tokens: 40, At: t0}
	for _, tt := range []struct {
		name   string
		s      State
		now    int64
		amount float64
		want   State
	}{
		{"zero changes nothing", s, t1, 0, s},
		{"NaN changes nothing", s, t1, math.NaN(), s},
		{"refund to the unused bucket changes nothing", State{}, t1, -5, State{}},
		{"debit of the unused bucket starts it from full", State{}, t1, 30, State{Tokens: 70, At: t1}},
		{"refill counts before the charge", s, t1, 10, State{Tokens: 31, At: t1}},
		{"clock backwards: no refill, time kept", s, t0 - sec, 10, State{Tokens: 30, At: t0}},
		{"infinite debit stops at -burst", s, t0, math.Inf(1), State{Tokens: -100, At: t0}},
		{"infinite refund stops at burst", s, t0, math.Inf(-1), State{Tokens: 100, At: t0}},
	} {
		if got := lim.Charge(tt.s, tt.now, tt.amount); got != tt.want {
			t.Errorf("%s: Charge(%+v, %v, %v) = %+v, want %+v", tt.name, tt.s, at(tt.now), tt.amount, got, tt.want)
		}
	}
	// In debt: Remaining is 0, the waits count the debt, FullAt too.
	debt := State{Tokens: -50, At: t0}
	_, d := lim.Take(debt, t0, 10)
	if d.Allowed || d.Remaining != 0 || ceilSec(d.RetryAfter) != 6 || d.ResetAfter != 15*time.Second {
		t.Errorf("Take in debt = %+v, want rejected, 0 remaining, retry 6s, reset 15s", d)
	}
	if got, want := lim.FullAt(debt), t0+15*sec; got != want {
		t.Errorf("FullAt(debt) = %v, want %v", at(got), at(want))
	}
	if got := lim.Report(-50, 0, 1, true); got.Remaining != 0 || got.ResetAfter != 15*time.Second {
		t.Errorf("Report(-50) = %+v", got)
	}
	// A limit whose burst shrank clamps an old debt to its own floor,
	// −(burst + rate × MaxWait).
	if got := (Limit{Rate: 0.25, Burst: 20}).Tokens(debt, t0); got != -35 {
		t.Errorf("Tokens with a smaller burst = %v, want -35", got)
	}
}

func TestPropertyChargedWithinBound(t *testing.T) {
	// Requests reserve a cost with Take and, once admitted, are charged
	// their real cost (anything from nothing to several bursts) with
	// Charge, at the same moment or later, possibly after other requests
	// were admitted. Over every interval [ti, tj] of the bucket's time the
	// total taken (reservations plus debits, less refunds, as applied to
	// the bucket) is at most burst + rate × (tj − ti) + the overshoot, and
	// the overshoot is at most one burst: the debt floor. The bucket never
	// holds less than −burst.
	for seed := int64(1); seed <= 300; seed++ {
		r := rand.New(rand.NewSource(seed))
		lim := randomLimit(r)
		s := State{}
		now := t0
		var pending []float64 // real costs of admitted requests not yet charged
		// taken is the running total P; the bound is checked against the
		// minimum of P − rate × t over earlier moments, as in
		// TestPropertyAdmittedWithinBound.
		taken, ops := 0.0, 0
		minQ := math.Inf(1)
		slack := slackPerTake(lim)
		apply := func(next State) {
			at := max(now, s.At)
			before := lim.Tokens(s, at)
			tsec := float64(at-t0) / 1e9
			minQ = min(minQ, taken-lim.Rate*tsec-slack*float64(ops))
			taken += before - lim.Tokens(next, at)
			ops++
			s = next
			if lim.Tokens(s, at) < -lim.Burst {
				t.Fatalf("seed %d, %+v: tokens %v below -burst", seed, lim, lim.Tokens(s, at))
			}
			excess := taken - lim.Rate*tsec - slack*float64(ops) - minQ
			if tol := 1e-12*lim.Burst + 1e-11*math.Abs(taken); excess > 2*lim.Burst+tol {
				t.Fatalf("seed %d, %+v: took %v beyond burst + rate × elapsed + one burst of overshoot",
					seed, lim, excess-2*lim.Burst)
			}
		}
		for range 2000 {
			reserve := randomCost(r, lim)
			if r.Intn(3) == 0 {
				now = earliest(lim, s, now, reserve)
			} else {
				now += randomGap(r, lim, reserve)
			}
			if len(pending) > 0 && r.Intn(2) == 0 {
				// Charge an earlier request: real cost less its reservation.
				i := r.Intn(len(pending))
				apply(lim.Charge(s, now, pending[i]))
				pending = append(pending[:i], pending[i+1:]...)
				continue
			}
			next, d := lim.Take(s, now, reserve)
			if !d.Allowed {
				continue
			}
			apply(next)
			real := reserve * 4 * r.Float64() // from nothing to four times the reservation
			if r.Intn(8) == 0 {
				real = lim.Burst * 3
			}
			pending = append(pending, real-reserve)
		}
	}
}
