package service

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// TestLedgerGenerations follows one ledger through its windows.
func TestLedgerGenerations(t *testing.T) {
	const w = int64(time.Minute)
	var l ledger
	l = l.at(10*w, w)
	l.grant("a", 5)
	if got := l.takeReturn("a", 3, 100); got != 3 || l.of("a").lease != [2]float64{2, 0} {
		t.Fatalf("return 3 of 5 = %v, ledger %+v", got, l)
	}
	l = l.at(11*w+1, w) // next window: current becomes previous
	l.grant("a", 4)
	if got := l.takeReturn("a", 3, 100); got != 3 || l.of("a").lease != [2]float64{3, 0} {
		t.Fatalf("return 3 (previous first) = %v, ledger %+v", got, l)
	}
	l = l.at(11*w-1, w) // the clock went backwards: nothing turns
	if l.of("a").lease != [2]float64{3, 0} {
		t.Fatalf("after a backwards clock: %+v", l)
	}
	l = l.at(13*w, w) // a window skipped: both dropped, and the caller
	if l.gen != 13 || l.returned != 0 || len(l.callers) != 0 {
		t.Fatalf("two windows later: %+v, want empty", l)
	}
	if got := give(&l.of("a").resv, math.NaN()); got != 0 {
		t.Fatalf("give NaN = %v", got)
	}
	// The return budget: a burst per window.
	l.grant("a", 100)
	if got := l.takeReturn("a", 8, 10); got != 8 {
		t.Fatalf("takeReturn 8 of a budget of 10 = %v", got)
	}
	if got := l.takeReturn("a", 8, 10); got != 2 {
		t.Fatalf("takeReturn 8 of the 2 left = %v", got)
	}
	if l = l.at(14*w, w); l.returned != 0 {
		t.Fatalf("next window: returned %v, want a new budget", l.returned)
	}
}

// TestLedgerPerCaller: a caller gives back only what it reserved or was
// granted, never another caller's; a caller with nothing outstanding is
// dropped when the ledger is next read, so a ledger holds one entry per
// caller with something outstanding; the copy at returns shares nothing.
func TestLedgerPerCaller(t *testing.T) {
	const w = int64(time.Minute)
	l := ledger{}.at(10*w, w)
	l.reserve("a", 30)
	l.grant("a", 7)
	if got := l.takeRefund("b", 20, 100); got != 0 {
		t.Fatalf("b refunds 20 of a's reservations: took %v, want 0", got)
	}
	if got := l.takeReturn("b", 5, 100); got != 0 {
		t.Fatalf("b returns 5 of a's grants: took %v, want 0", got)
	}
	if len(l.callers) != 1 {
		t.Fatalf("a refund and a return of a caller holding nothing added it: %+v", l.callers)
	}
	l.reserve("b", 4)
	if got := l.takeRefund("b", 20, 100); got != 4 {
		t.Fatalf("b refunds 20 of its 4: took %v", got)
	}
	if got := l.takeRefund("a", 50, 100); got != 30 {
		t.Fatalf("a refunds 50 of its 30: took %v", got)
	}
	c := l.at(10*w, w)
	if len(c.callers) != 1 || c.callers[0].name != "a" || c.callers[0].lease != [2]float64{7, 0} {
		t.Fatalf("after the refunds: %+v, want a's grant of 7 alone", c.callers)
	}
	c.grant("a", 1)
	if l.of("a").lease != [2]float64{7, 0} {
		t.Fatalf("a change to the copy changed the ledger: %+v", l.callers)
	}
}

// TestLedgerRefundBudget: a window takes back in refunds at most what it
// reserved plus a burst, whoever refunds; the next window brings a new
// budget, so reservations kept over a window come back a burst at a time.
func TestLedgerRefundBudget(t *testing.T) {
	const w = int64(time.Minute)
	l := ledger{}.at(10*w, w)
	l.reserve("a", 100)
	l.reserve("b", 100)
	if got := l.takeRefund("a", 100, 10); got != 100 {
		t.Fatalf("a refunds all it reserved in the window = %v", got)
	}
	if got := l.takeRefund("b", 100, 10); got != 100 {
		t.Fatalf("b refunds all it reserved in the window = %v", got)
	}
	l.reserve("a", 50)
	l.reserve("b", 50)
	l = l.at(11*w, w) // the next window: 100 outstanding from the last one
	if got := l.takeRefund("a", 50, 10); got != 10 {
		t.Fatalf("refund 50 of the last window's reservations = %v, want a burst (10)", got)
	}
	if got := l.takeRefund("b", 50, 10); got != 0 {
		t.Fatalf("b refunds 50 of a spent budget = %v", got)
	}
	l.reserve("b", 5)
	if got := l.takeRefund("b", 50, 10); got != 5 || l.refunded != 15 {
		t.Fatalf("b refunds 50 after reserving 5 = %v (refunded %v), want 5", got, l.refunded)
	}
	if l.of("a").resv != [2]float64{0, 40} || l.of("b").resv != [2]float64{5, 45} { // oldest first
		t.Fatalf("reservations after the refunds: %+v", l.callers)
	}
	l = l.at(13*w, w)
	if l.refunded != 0 || l.reserved != 0 || len(l.callers) != 0 {
		t.Fatalf("two windows later: %+v, want a new budget and nothing outstanding", l)
	}
}

// TestLedgerProperty runs random sequences of decide (refundable or not),
// lease (with returns) and charge (debits and refunds) calls from several
// callers, some honest (returning and refunding only what they hold) and
// some not (returning and refunding at random), against the Redis scripts
// and the memory store, and requires at every step: identical answers from
// both stores; each caller's returns never above its grants and its refunds
// never above its refundable reservations made so far; and what was
// admitted (decisions and grants, net of what came back) within burst +
// rate × t.
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
			var admitted, returned, refunded float64
			var grantedBy, returnedBy, reservedBy, refundedBy [clients]float64
			start := t0.UnixNano()
			nowUs := t0.UnixMicro()
			two := func(x float64) float64 { return math.Round(x*100) / 100 }
			for step := range 400 {
				nowUs += int64(r.IntN(300_000)) // up to 0.3 s
				m.SetTime(time.UnixMicro(nowUs))
				clk.Set(time.UnixMicro(nowUs))
				c := r.IntN(clients)
				honest := c%2 == 0
				ctx := WithCaller(ctx, "gw-"+strconv.Itoa(c))
				var desc string
				switch r.IntN(3) {
				case 0:
					cost := two(r.Float64() * burst / 2)
					req := one("k", rate, burst, cost)
					req.Buckets[0].Refundable = r.IntN(3) != 0
					ar, err1 := rs.Decide(ctx, req)
					am, err2 := ms.Decide(ctx, req)
					if err1 != nil || err2 != nil || ar.Allowed != am.Allowed || ar.Buckets[0] != am.Buckets[0] {
						t.Fatalf("step %d: decide %v: redis %+v %v, memory %+v %v", step, cost, ar, err1, am, err2)
					}
					if ar.Allowed {
						admitted += cost
					}
					if ar.Allowed && req.Buckets[0].Refundable {
						reservedBy[c] += cost
						reserved[c] += cost
					}
					desc = fmt.Sprintf("decide %v: %v", cost, ar.Allowed)
				case 1:
					b := wire.LeaseBucket{Key: "k", Rate: rate, Burst: burst, Want: two(r.Float64() * burst / 2)}
					b.Min = two(b.Want * r.Float64())
					if honest {
						b.Return = two(held[c] * r.Float64())
						held[c] -= b.Return
					} else {
						b.Return = two(r.Float64() * burst)
					}
					req := &wire.LeaseRequest{Buckets: []wire.LeaseBucket{b}}
					ar, err1 := rs.Lease(ctx, req)
					am, err2 := ms.Lease(ctx, req)
					if err1 != nil || err2 != nil || ar.Granted != am.Granted || ar.Buckets[0] != am.Buckets[0] {
						t.Fatalf("step %d: lease %+v: redis %+v %v, memory %+v %v", step, b, ar, err1, am, err2)
					}
					g := ar.Buckets[0]
					grantedBy[c] += g.Tokens
					returnedBy[c] += g.Returned
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
					req := &wire.ChargeRequest{Buckets: []wire.ChargeBucket{{Key: "k", Rate: rate, Burst: burst, Amount: amount}}}
					ar, err1 := rs.Charge(ctx, req)
					am, err2 := ms.Charge(ctx, req)
					if err1 != nil || err2 != nil || ar.Buckets[0] != am.Buckets[0] {
						t.Fatalf("step %d: charge %v: redis %+v %v, memory %+v %v", step, amount, ar, err1, am, err2)
					}
					if a := ar.Buckets[0].Applied; a < 0 {
						refunded -= a // a debit (into debt) only lowers what can be admitted
						refundedBy[c] -= a
					}
					desc = fmt.Sprintf("charge %v: %+v", amount, ar.Buckets[0])
				}
				if returnedBy[c] > grantedBy[c]+1e-9 {
					t.Fatalf("step %d (%s): caller %d returned %v of %v granted to it", step, desc, c, returnedBy[c], grantedBy[c])
				}
				if refundedBy[c] > reservedBy[c]+1e-9 {
					t.Fatalf("step %d (%s): caller %d refunded %v of %v it reserved", step, desc, c, refundedBy[c], reservedBy[c])
				}
				elapsed := float64(nowUs*1000-start) / 1e9
				if over := admitted - returned - refunded - (burst + rate*elapsed); over > 1e-6*burst {
					t.Fatalf("step %d (%s): admitted %v net of %v returned and %v refunded: %v over burst + rate × t", step, desc, admitted, returned, refunded, over)
				}
			}
		})
	}
}
