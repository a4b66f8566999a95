package service

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// TestChargeMatchesModel runs random decisions (refundable or not, delayed
// within a max delay or not) and charges (debits into debt, refunds) on one
// bucket from two callers against the Redis store (decide.lua and
// charge.lua), the memory store and package bucket (Reserve, Charge) with
// the ledger, and requires the same decisions, waits and answers from all
// three; the bucket never holds less than -burst, or than -(burst + rate ×
// bucket.MaxWait) once delayed decisions are in its debt (a charge leaves
// that deeper debt where it is, and a refund gives back from it). Seeds 7
// to 9 run a quota (rate 0, periods of 2.5 s that the clock crosses):
// debts forgiven and the limit whole again at each period's start.
func TestChargeMatchesModel(t *testing.T) {
	for seed := uint64(1); seed <= 9; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(seed, 17))
			clk := &fakeClock{}
			m, _, rs := newMini(t, RedisOptions{LedgerWindow: 10 * time.Second, Now: func() time.Time { return time.Unix(0, clk.Now()) }})
			ms := NewMemoryStore(MemoryOptions{Now: clk.Now, LedgerWindow: 10 * time.Second})
			lim := randomLimit(r)
			if seed%3 == 0 && seed < 7 {
				lim = smoothLimit(r, lim)
			}
			quota := seed >= 7
			var period wire.Period
			if quota {
				lim.Rate = 0
			}
			var state bucket.State
			var led ledger // the model's ledger: reservations, refunds clamped to them
			window := int64(10 * time.Second)
			nowUs := t0.UnixMicro()
			for step := range 300 {
				if quota {
					nowUs += int64(r.IntN(400_000))
					start := (nowUs / 1000) / 2500 * 2500
					period = wire.Period{PeriodStartMs: start, PeriodEndMs: start + 2500}
					lim.PeriodStart, lim.PeriodEnd = start*1e6, (start+2500)*1e6
				} else {
					nowUs += randomStep(r, lim, lim.Burst/4, false)
				}
				m.SetTime(time.UnixMicro(nowUs))
				clk.Set(time.UnixMicro(nowUs))
				now := nowUs * 1000
				caller := []string{"gw-a", "gw-b"}[r.IntN(2)]
				ctx := WithCaller(context.Background(), caller)
				if lim.FullAt(state) <= now && !(led.refunded > 0 && now < (led.gen+1)*window) {
					state, led = bucket.State{}, ledger{} // full: forgotten, ledger and all
				}
				if quota && state.At > 0 && state.At < lim.PeriodStart {
					state, led = bucket.State{}, ledger{} // a new period: full, its ledger dropped
				}
				led = led.at(now, window)
				if r.IntN(2) == 0 {
					// Two decimals: miniredis's Lua reads long decimals a unit off.
					cost := math.Max(0.01, math.Round(r.Float64()*lim.Burst*100)/100)
					req := one("k", lim.Rate, lim.Burst, cost)
					req.Buckets[0].Refundable = r.IntN(4) != 0
					if !quota {
						req.Buckets[0].MaxDelayMs = randomDelay(r, lim)
					}
					req.Buckets[0].Period = period
					ar, err1 := rs.Decide(ctx, req)
					am, err2 := ms.Decide(ctx, req)
					if err1 != nil || err2 != nil {
						t.Fatalf("step %d: %v, %v", step, err1, err2)
					}
					var d bucket.Decision
					state, d = lim.Reserve(state, now, cost, time.Duration(req.Buckets[0].MaxDelayMs)*time.Millisecond)
					if d.Allowed && req.Buckets[0].Refundable {
						led.reserve(caller, cost)
					}
					if ar.Allowed != d.Allowed || am.Allowed != d.Allowed || ar.Buckets[0] != am.Buckets[0] ||
						ar.WaitMs != ceilMs(d.Wait) || am.WaitMs != ar.WaitMs {
						t.Fatalf("step %d: take %v: redis %+v, memory %+v, model %+v", step, cost, ar, am, d)
					}
					if tokens := lim.Tokens(state, now); tokens < -lim.Burst-lim.Rate*bucket.MaxWait.Seconds() {
						t.Fatalf("step %d: tokens %v below -(burst + rate × max wait)", step, tokens)
					}
					continue
				}
				amount := math.Round((r.Float64()*4-1)*lim.Burst*100) / 100
				amount = math.Max(amount, -lim.Burst)
				req := &wire.ChargeRequest{Buckets: []wire.ChargeBucket{{Key: "k", Rate: lim.Rate, Burst: lim.Burst, Amount: amount, Period: period}}}
				ar, err1 := rs.Charge(ctx, req)
				am, err2 := ms.Charge(ctx, req)
				if err1 != nil || err2 != nil {
					t.Fatalf("step %d: %v, %v", step, err1, err2)
				}
				before := lim.Tokens(state, now)
				took := min(amount, 2*lim.Burst) // clamped: at most 2 × burst
				if amount < 0 {
					took = -led.takeRefund(caller, -amount, lim.Burst) // a refund: at most what caller reserved, and the budget
				}
				applied := 0.0
				if took != 0 {
					applied = chargeTook(before, took, lim.Burst)
					state = lim.Charge(state, now, took)
				}
				tokens := lim.Tokens(state, now)
				want := charged(&req.Buckets[0], tokens, max(state.At, now)-now, now)
				want.Applied = applied
				if ar.Buckets[0] != want || am.Buckets[0] != want {
					t.Fatalf("step %d: charge %v: redis %+v, memory %+v, model %+v (tokens %v)", step, amount, ar.Buckets[0], am.Buckets[0], want, tokens)
				}
				if before := lim.Tokens(state, now); tokens < -lim.Burst && tokens < before && amount > 0 {
					t.Fatalf("step %d: charge took tokens %v below -burst", step, tokens)
				}
			}
		})
	}
}
