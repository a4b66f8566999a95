package service

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestLedgerGenerations follows one ledger through its windows.
func TestLedgerGenerations(t *testing.T) {
	const w = int64(time.Minute)
	var l ledger
	l = l.at(10*w, w)
	l.lease[0] += 5
	if got := give(&l.lease, 3); got != 3 || l.lease != [2]float64{2, 0} {
		t.Fatalf("give 3 of 5 = %v, ledger %+v", got, l)
	}
	l = l.at(11*w+1, w) // next window: current becomes previous
	l.lease[0] += 4
	if got := give(&l.lease, 3); got != 3 || l.lease != [2]float64{3, 0} {
		t.Fatalf("give 3 (previous first) = %v, ledger %+v", got, l)
	}
	l = l.at(11*w-1, w) // the clock went backwards: nothing turns
	if l.lease != [2]float64{3, 0} {
		t.Fatalf("after a backwards clock: %+v", l)
	}
	l = l.at(13*w, w) // a window skipped: both dropped
	if l != (ledger{gen: 13}) {
		t.Fatalf("two windows later: %+v, want empty", l)
	}
	if got := give(&l.resv, math.NaN()); got != 0 {
		t.Fatalf("give NaN = %v", got)
	}
	// The return budget: a burst per window.
	l.lease[0] = 100
	if got := l.takeReturn(8, 10); got != 8 {
		t.Fatalf("takeReturn 8 of a budget of 10 = %v", got)
	}
	if got := l.takeReturn(8, 10); got != 2 {
		t.Fatalf("takeReturn 8 of the 2 left = %v", got)
	}
	if l = l.at(14*w, w); l.returned != 0 {
		t.Fatalf("next window: returned %v, want a new budget", l.returned)
	}
}

// TestLedgerProperty runs random sequences of decide, lease (with returns)
// and charge (debits and refunds) calls from several clients, some honest
// (returning and refunding only what they hold) and some not (returning and
// refunding at random), against the Redis scripts and the memory store, and
// requires at every step: identical answers from both stores; returns never
// above the grants and refunds never above the reservations made so far;
// and what was admitted (decisions and grants, net of what came back)
// within burst + rate × t.
func TestLedgerProperty(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(seed, 29))
			m, _, rs := newMini(t, RedisOptions{LedgerWindow: 2 * time.Second})
			clk := &fakeClock{}
			ms := NewMemoryStore(MemoryOptions{Now: clk.Now, LedgerWindow: 2 * time.Second})
			ctx := context.Background()
			rate, burst := float64(1+r.IntN(20)), float64(5+r.IntN(50))
			const clients = 4
			held := make([]float64, clients)     // an honest client's unspent grants
			reserved := make([]float64, clients) // an honest client's unsettled reservations
			var admitted, granted, returned, reservedAll, refunded float64
			start := t0.UnixNano()
			nowUs := t0.UnixMicro()
			two := func(x float64) float64 { return math.Round(x*100) / 100 }
			for step := range 400 {
				nowUs += int64(r.IntN(300_000)) // up to 0.3 s
				m.SetTime(time.UnixMicro(nowUs))
				clk.Set(time.UnixMicro(nowUs))
				c := r.IntN(clients)
				honest := c%2 == 0
				var desc string
				switch r.IntN(3) {
				case 0:
					cost := two(r.Float64() * burst / 2)
					req := one("k", rate, burst, cost)
					ar, err1 := rs.Decide(ctx, req)
					am, err2 := ms.Decide(ctx, req)
					if err1 != nil || err2 != nil || ar.Allowed != am.Allowed || ar.Buckets[0] != am.Buckets[0] {
						t.Fatalf("step %d: decide %v: redis %+v %v, memory %+v %v", step, cost, ar, err1, am, err2)
					}
					if ar.Allowed {
						admitted += cost
						reservedAll += cost
						reserved[c] += cost
					}
					desc = fmt.Sprintf("decide %v: %v", cost, ar.Allowed)
				case 1:
					b := LeaseBucket{Key: "k", Rate: rate, Burst: burst, Want: two(r.Float64() * burst / 2)}
					b.Min = two(b.Want * r.Float64())
					if honest {
						b.Return = two(held[c] * r.Float64())
						held[c] -= b.Return
					} else {
						b.Return = two(r.Float64() * burst)
					}
					req := &LeaseRequest{Buckets: []LeaseBucket{b}}
					ar, err1 := rs.Lease(ctx, req)
					am, err2 := ms.Lease(ctx, req)
					if err1 != nil || err2 != nil || ar.Granted != am.Granted || ar.Buckets[0] != am.Buckets[0] {
						t.Fatalf("step %d: lease %+v: redis %+v %v, memory %+v %v", step, b, ar, err1, am, err2)
					}
					g := ar.Buckets[0]
					granted += g.Tokens
					admitted += g.Tokens
					returned += g.Returned
					if honest {
						held[c] += g.Tokens
					}
					desc = fmt.Sprintf("lease %+v: %+v", b, g)
				default:
					amount := two((r.Float64()*2 - 1) * burst)
					if honest && amount < 0 {
						amount = -two(reserved[c] * r.Float64())
						reserved[c] += amount
					}
					req := &ChargeRequest{Buckets: []ChargeBucket{{Key: "k", Rate: rate, Burst: burst, Amount: amount}}}
					ar, err1 := rs.Charge(ctx, req)
					am, err2 := ms.Charge(ctx, req)
					if err1 != nil || err2 != nil || ar.Buckets[0] != am.Buckets[0] {
						t.Fatalf("step %d: charge %v: redis %+v %v, memory %+v %v", step, amount, ar, err1, am, err2)
					}
					if a := ar.Buckets[0].Applied; a < 0 {
						refunded -= a // a debit (into debt) only lowers what can be admitted
					}
					desc = fmt.Sprintf("charge %v: %+v", amount, ar.Buckets[0])
				}
				if returned > granted+1e-9 {
					t.Fatalf("step %d (%s): returned %v of %v granted", step, desc, returned, granted)
				}
				if refunded > reservedAll+1e-9 {
					t.Fatalf("step %d (%s): refunded %v of %v reserved", step, desc, refunded, reservedAll)
				}
				elapsed := float64(nowUs*1000-start) / 1e9
				if over := admitted - returned - refunded - (burst + rate*elapsed); over > 1e-6*burst {
					t.Fatalf("step %d (%s): admitted %v net of %v returned and %v refunded: %v over burst + rate × t", step, desc, admitted, returned, refunded, over)
				}
			}
		})
	}
}
