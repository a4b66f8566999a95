package service

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// TestLeaseMatchesModel runs random lease calls (wants, mins and returns
// over one to three buckets, the clock moving on) against the Redis store
// (lease.lua), the memory store and package bucket's Lease behind the
// ledger's clamp of the returns, and requires bit-identical grants and
// tokens from all three; and, over the whole run, that the tokens granted
// never exceed what the buckets held plus the returns plus the refill (no
// over-grant).
func TestLeaseMatchesModel(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(seed, 11))
			m, _, rs := newMini(t, RedisOptions{})
			clk := &fakeClock{}
			ms := NewMemoryStore(MemoryOptions{Now: clk.Now})
			n := 1 + int(seed%3)
			req := &wire.LeaseRequest{HashTag: "h", Buckets: make([]wire.LeaseBucket, n)}
			lims := make([]bucket.Limit, n)
			states := make([]bucket.State, n)
			leds := make([]ledger, n)
			window := int64(DefaultLedgerWindow)
			granted, returned := make([]float64, n), make([]float64, n)
			for i := range n {
				lims[i] = randomLimit(r)
				req.Buckets[i] = wire.LeaseBucket{Key: "k" + strconv.Itoa(i), Rate: lims[i].Rate, Burst: lims[i].Burst}
			}
			nowUs := t0.UnixMicro()
			startNs := nowUs * 1000
			for step := range 200 {
				for i := range n {
					b := &req.Buckets[i]
					b.Want = math.Round(r.Float64()*b.Burst*100) / 100
					b.Min = math.Round(r.Float64()*b.Want*100) / 100
					b.Return = 0
					if r.IntN(4) == 0 {
						// Two decimals: miniredis's Lua reads long decimals a unit off.
						b.Return = math.Floor(math.Min(granted[i]-returned[i], b.Burst)*r.Float64()*100) / 100
					}
				}
				nowUs += randomStep(r, lims[0], req.Buckets[0].Min, false)
				m.SetTime(time.UnixMicro(nowUs))
				clk.Set(time.UnixMicro(nowUs))
				caller := []string{"gw-a", "gw-b"}[r.IntN(2)]
				ctx := WithCaller(context.Background(), caller)
				ar, err1 := rs.Lease(ctx, req)
				am, err2 := ms.Lease(ctx, req)
				if err1 != nil || err2 != nil {
					t.Fatalf("step %d: %v, %v", step, err1, err2)
				}
				now := nowUs * 1000
				all := true
				rets := make([]float64, n)
				for i, b := range req.Buckets {
					// The stores forget a full bucket, ledger and all,
					// unless its window's return budget is in use.
					if lims[i].FullAt(states[i]) <= now && !((leds[i].returned > 0 || leds[i].refunded > 0) && now < (leds[i].gen+1)*window) {
						states[i], leds[i] = bucket.State{}, ledger{}
					}
					leds[i] = leds[i].at(now, window)
					rets[i] = leds[i].takeReturn(caller, b.Return, b.Burst)
					if _, _, ok, _ := lims[i].Lease(states[i], now, rets[i], b.Want, b.Min); !ok {
						all = false
					}
				}
				if ar.Granted != all || am.Granted != all {
					t.Fatalf("step %d: granted redis %v, memory %v, model %v", step, ar.Granted, am.Granted, all)
				}
				for i, b := range req.Buckets {
					g := 0.0
					if all {
						states[i], g, _, _ = lims[i].Lease(states[i], now, rets[i], b.Want, b.Min)
						leds[i].grant(caller, g)
					} else {
						states[i] = lims[i].Refund(states[i], now, rets[i])
					}
					if ar.Buckets[i] != am.Buckets[i] || math.Float64bits(ar.Buckets[i].Tokens) != math.Float64bits(g) {
						t.Fatalf("step %d bucket %d: redis %+v, memory %+v, model granted %v", step, i, ar.Buckets[i], am.Buckets[i], g)
					}
					granted[i] += g
					returned[i] += rets[i]
					elapsed := float64(nowUs*1000-startNs) / 1e9
					if over := granted[i] - returned[i] - (b.Burst + b.Rate*elapsed); over > 1e-6*b.Burst {
						t.Fatalf("step %d bucket %d: granted %v more than burst + rate × t allows", step, i, over)
					}
				}
			}
		})
	}
}

// TestLeaseTimeline follows one bucket through grants, a refusal, a return
// and refill.
func TestLeaseTimeline(t *testing.T) {
	m, _, s := newMini(t, RedisOptions{})
	ctx := context.Background()
	call := func(want, lo, ret float64) wire.LeaseAnswer {
		t.Helper()
		a, err := s.Lease(ctx, &wire.LeaseRequest{Buckets: []wire.LeaseBucket{{Key: "k", Rate: 2, Burst: 10, Want: want, Min: lo, Return: ret}}})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	check := func(a wire.LeaseAnswer, granted bool, tokens float64, remaining, retryMs int64) {
		t.Helper()
		g := a.Buckets[0]
		if a.Granted != granted || g.Tokens != tokens || g.Remaining != remaining || g.RetryAfterMs != retryMs {
			t.Errorf("lease = %+v %+v, want granted %v tokens %v remaining %d retry %dms", a.Granted, g, granted, tokens, remaining, retryMs)
		}
	}
	check(call(4, 1, 0), true, 4, 6, 0)    // full bucket: the whole want
	check(call(8, 1, 0), true, 6, 0, 0)    // what is left, above min
	check(call(3, 1, 0), false, 0, 0, 500) // nothing: min 1 at 2/s is 500ms away
	check(call(0, 0, 5), true, 0, 5, 0)    // a return comes back
	m.SetTime(t0.Add(time.Second))
	check(call(10, 7, 0), true, 7, 0, 0) // 5 + 2 refilled: exactly min
}
