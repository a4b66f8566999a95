package service

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// Decisions that may wait (max_delay_ms), replayed on both stores (the
// Redis scripts on miniredis, and the memory store) through the decision
// core.

// delayed is a request for cost 1 of key at rate/burst that may wait up to
// delayMs.
func delayed(key string, rate, burst float64, delayMs int64) *wire.Request {
	r := one(key, rate, burst, 1)
	r.Buckets[0].MaxDelayMs = delayMs
	return r
}

// TestDelayTimeline: at 10 a second, burst 1 and a max delay of 1000 ms,
// 30 requests at one moment: one goes at once, ten are admitted with waits
// of 100 ms to 1000 ms, spaced by the rate, and the rest are refused at
// once, with the retry_after they would get without a delay and nothing
// taken. Half-way through the waits, a new request queues behind them.
func TestDelayTimeline(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			ts.set(t0)
			var waits []int64
			refused := 0
			for i := range 30 {
				a := mustDecide(t, ts.st, delayed("smooth", 10, 1, 1000))
				switch {
				case a.Allowed:
					if a.WaitMs != a.Buckets[0].WaitMs || a.RetryAfterMs != 0 {
						t.Fatalf("request %d: %+v: the answer's wait is not its bucket's", i, a)
					}
					waits = append(waits, a.WaitMs)
				default:
					refused++
					// Ten tokens of debt, one more to take: 1.1 s.
					if a.WaitMs != 0 || a.Buckets[0].WaitMs != 0 || a.RetryAfterMs != 1100 || a.Buckets[0].Remaining != 0 || a.Buckets[0].ResetMs != 1100 {
						t.Fatalf("request %d refused: %+v, want retry 1100ms, nothing taken (reset 1100ms), no wait", i, a)
					}
				}
			}
			if want := []int64{0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000}; !slices.Equal(waits, want) || refused != 19 {
				t.Fatalf("waits %v and %d refused; want %v and 19", waits, refused, want)
			}
			ts.set(t0.Add(500 * time.Millisecond)) // 5 tokens of debt paid back
			if a := mustDecide(t, ts.st, delayed("smooth", 10, 1, 1000)); !a.Allowed || a.WaitMs != 600 {
				t.Fatalf("at +500ms: %+v, want admitted behind the queue, waiting 600ms", a)
			}
			// Without a max delay, the same bucket refuses as it always did.
			if a := mustDecide(t, ts.st, one("smooth", 10, 1, 1)); a.Allowed || a.WaitMs != 0 || a.RetryAfterMs != 700 {
				t.Fatalf("no max delay: %+v, want refused, retry 700ms", a)
			}
		})
	}
}

// TestDelayStacked: a request over several buckets waits for the longest of
// their waits, all taken in one step or none: when one bucket would wait
// past its bound (or has none), the others are left as they were.
func TestDelayStacked(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			ts.set(t0)
			fast := wire.Bucket{Key: "fast", Rate: 10, Burst: 1, Cost: 1, MaxDelayMs: 1000}
			slow := wire.Bucket{Key: "slow", Rate: 2, Burst: 1, Cost: 1, MaxDelayMs: 1000}
			req := &wire.Request{Buckets: []wire.Bucket{fast, slow}}
			if a := mustDecide(t, ts.st, req); !a.Allowed || a.WaitMs != 0 {
				t.Fatalf("first: %+v, want at once", a)
			}
			a := mustDecide(t, ts.st, req)
			if !a.Allowed || a.Buckets[0].WaitMs != 100 || a.Buckets[1].WaitMs != 500 || a.WaitMs != 500 {
				t.Fatalf("second: %+v, want waits 100 and 500ms, the request 500ms", a)
			}
			// slow would now wait 1000 ms: within its bound; a third time
			// 1500 ms: past it, so fast (which would wait 300 ms) is left
			// untouched too.
			if a := mustDecide(t, ts.st, req); !a.Allowed || a.WaitMs != 1000 {
				t.Fatalf("third: %+v, want 1000ms", a)
			}
			a = mustDecide(t, ts.st, req)
			if a.Allowed || a.WaitMs != 0 || !a.Buckets[0].Allowed || a.Buckets[0].WaitMs != 0 || a.Buckets[1].Allowed || a.RetryAfterMs != 1500 {
				t.Fatalf("fourth: %+v, want refused by slow (retry 1500ms), fast allowed alone, no wait", a)
			}
			if a := mustDecide(t, ts.st, &wire.Request{Buckets: []wire.Bucket{fast}}); !a.Allowed || a.WaitMs != 300 {
				t.Fatalf("fast alone after the refusal: %+v, want 300ms (two tokens of debt, not three)", a)
			}
			// A bucket without a max delay refuses for the request.
			plain := wire.Bucket{Key: "plain", Rate: 1, Burst: 1, Cost: 1}
			mustDecide(t, ts.st, &wire.Request{Buckets: []wire.Bucket{plain}})
			a = mustDecide(t, ts.st, &wire.Request{Buckets: []wire.Bucket{fast, plain}})
			if a.Allowed || a.WaitMs != 0 || a.RetryAfterMs != 1000 {
				t.Fatalf("with a plain bucket short: %+v, want refused, retry 1000ms", a)
			}
			if a := mustDecide(t, ts.st, &wire.Request{Buckets: []wire.Bucket{fast}}); a.WaitMs != 400 {
				t.Fatalf("fast alone: %+v, want 400ms (untouched by the refusal)", a)
			}
		})
	}
}

// TestDelayShadow: a shadow bucket with a max delay is decided on its own:
// it goes into debt as the rule would if enforced and answers the wait it
// would have had, but the request's wait is the enforced buckets' only.
func TestDelayShadow(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			ts.set(t0)
			sh := wire.Bucket{Key: "shadow", Rate: 10, Burst: 1, Cost: 1, MaxDelayMs: 1000, Shadow: true}
			en := wire.Bucket{Key: "enforced", Rate: 10, Burst: 10, Cost: 1}
			req := &wire.Request{Buckets: []wire.Bucket{sh, en}}
			mustDecide(t, ts.st, req)
			a := mustDecide(t, ts.st, req)
			if !a.Allowed || a.WaitMs != 0 || !a.Buckets[0].Allowed || a.Buckets[0].WaitMs != 100 {
				t.Fatalf("%+v: want allowed at once, the shadow bucket answering the 100ms it would have held", a)
			}
		})
	}
}

// TestDelayedRefundOnce: a held request whose client goes away gives back
// what it took through a charge's refund (-cost), exactly once, though its
// rule is not refundable: a request that may be held reserves what each of
// its enforced buckets takes. A second refund, and another caller's, give
// back nothing; a request that waited for nothing, without a max delay,
// reserves nothing, as before.
func TestDelayedRefundOnce(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			ts.set(t0)
			held := wire.Bucket{Key: "held", Rate: 10, Burst: 2, Cost: 2, MaxDelayMs: 1000}
			plain := wire.Bucket{Key: "beside", Rate: 10, Burst: 100, Cost: 3}
			req := &wire.Request{Buckets: []wire.Bucket{held, plain}}
			mustDecide(t, ts.st, one("held", 10, 2, 2)) // drained; reserves nothing
			a := mustDecide(t, ts.st, req)
			if !a.Allowed || a.WaitMs != 200 || a.Buckets[0].Tokens != -2 || a.Buckets[1].Tokens != 97 {
				t.Fatalf("held request: %+v, want a wait of 200ms, held at -2, beside at 97", a)
			}
			refund := func(caller string, b wire.Bucket) float64 {
				t.Helper()
				ca, err := ts.st.Charge(WithCaller(t.Context(), caller), &wire.ChargeRequest{Buckets: []wire.ChargeBucket{
					{Key: b.Key, Rate: b.Rate, Burst: b.Burst, Amount: -b.Cost}}})
				if err != nil {
					t.Fatal(err)
				}
				return ca.Buckets[0].Applied
			}
			if got := refund("gw-other", held); got != 0 {
				t.Fatalf("another caller's refund gave back %v, want 0", got)
			}
			// The client went away: the gateway refunds both buckets.
			if got := refund(DefaultCaller, held); got != -2 {
				t.Fatalf("refund of the held bucket gave back %v, want 2", -got)
			}
			if got := refund(DefaultCaller, plain); got != -3 {
				t.Fatalf("refund of the bucket beside gave back %v, want 3", -got)
			}
			for _, b := range []wire.Bucket{held, plain} {
				if got := refund(DefaultCaller, b); got != 0 {
					t.Fatalf("second refund of %s gave back %v, want 0", b.Key, -got)
				}
			}
			// Back to where the drain left them: the next request takes the
			// held one's place.
			if a := mustDecide(t, ts.st, req); !a.Allowed || a.WaitMs != 200 || a.Buckets[0].Tokens != -2 || a.Buckets[1].Tokens != 97 {
				t.Fatalf("after the refunds: %+v, want the held request's place again", a)
			}
			// Without a max delay nothing is reserved.
			mustDecide(t, ts.st, one("fixed", 10, 10, 4))
			if got := refund(DefaultCaller, wire.Bucket{Key: "fixed", Rate: 10, Burst: 10, Cost: 4}); got != 0 {
				t.Fatalf("refund of a fixed-cost take gave back %v, want 0", -got)
			}
		})
	}
}

// TestLeaseWaitsOutDelayedDebt: a bucket in debt from delayed decisions
// grants no lease until the debt is paid back, however many bursts deep it
// is (here ten bursts: a smooth bucket, burst 1 at 10 a second); a lease
// without a min grants nothing meanwhile.
func TestLeaseWaitsOutDelayedDebt(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			ts.set(t0)
			for range 11 {
				if a := mustDecide(t, ts.st, delayed("debt", 10, 1, 1000)); !a.Allowed {
					t.Fatalf("%+v", a)
				}
			}
			lease := wire.LeaseBucket{Key: "debt", Rate: 10, Burst: 1, Want: 1, Min: 1}
			for _, step := range []struct {
				at      time.Duration
				granted bool
				retryMs int64
			}{
				{0, false, 1100},
				{500 * time.Millisecond, false, 600},
				{1000 * time.Millisecond, false, 100}, // out of debt, not yet a token
				{1100 * time.Millisecond, true, 0},
			} {
				ts.set(t0.Add(step.at))
				if !step.granted {
					free := lease
					free.Min = 0
					if a := mustLease(t, ts.st, free); a.Buckets[0].Tokens != 0 {
						t.Fatalf("+%v: a lease without a min granted %v from a debt", step.at, a.Buckets[0].Tokens)
					}
				}
				a := mustLease(t, ts.st, lease)
				if a.Granted != step.granted || a.Buckets[0].RetryAfterMs != step.retryMs {
					t.Fatalf("+%v: lease %+v, want granted %v, retry %dms", step.at, a, step.granted, step.retryMs)
				}
			}
		})
	}
}

// TestDelayMetrics: limitd counts the decisions it answered with a wait,
// the shadow buckets that would have waited, the refusals past a max delay,
// and the waits it answered (their sum is the time held).
func TestDelayMetrics(t *testing.T) {
	clk := &fakeClock{}
	clk.Set(t0)
	s, reg := newTestServer(t, NewMemoryStore(MemoryOptions{Now: clk.Now}), "")
	body := `{"buckets":[{"key":"d","tokens_per_second":10,"burst":1,"max_delay_ms":250},` +
		`{"key":"s","tokens_per_second":10,"burst":1,"max_delay_ms":1000,"shadow":true}]}`
	var got []string
	for range 5 {
		w := do(s, "POST", "/v1/decide", body)
		if w.Code != 200 {
			t.Fatal(w.Code, w.Body)
		}
		got = append(got, strings.TrimSpace(w.Body.String()))
	}
	want := []string{
		`{"allowed":true,"retry_after_ms":0,"buckets":[{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":100},{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":100}]}`,
		`{"allowed":true,"retry_after_ms":0,"wait_ms":100,"buckets":[{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":200,"wait_ms":100},{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":200,"wait_ms":100}]}`,
		`{"allowed":true,"retry_after_ms":0,"wait_ms":200,"buckets":[{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":300,"wait_ms":200},{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":300,"wait_ms":200}]}`,
		`{"allowed":false,"retry_after_ms":300,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":300,"reset_ms":300},{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":400,"wait_ms":300}]}`,
		`{"allowed":false,"retry_after_ms":300,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":300,"reset_ms":300},{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":500,"wait_ms":400}]}`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("answers:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for name, v := range map[string]float64{
		"limitd_decisions_past_delay_total": 2,
		"limitd_rejections_total":           2,
		"limitd_decisions_total":            5,
	} {
		if c := gatherCounter(t, reg, name); c != v {
			t.Errorf("%s = %v, want %v", name, c, v)
		}
	}
	for mode, v := range map[string]float64{"enforced": 2, "shadow": 4} {
		if c := labelledValue(t, reg, "limitd_decisions_delayed_total", mode); c != v {
			t.Errorf("limitd_decisions_delayed_total{mode=%q} = %v, want %v", mode, c, v)
		}
	}
	count, sum := histogramOf(t, reg, "limitd_decision_wait_seconds")
	if count != 2 || sum < 0.3-1e-9 || sum > 0.3+1e-9 {
		t.Errorf("limitd_decision_wait_seconds: count %d, sum %v; want 2 and 0.3", count, sum)
	}
}

// labelledValue is the counter family name's series whose one label is
// value.
func labelledValue(t *testing.T, reg prometheus.Gatherer, name, value string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == value {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s}", name, value)
	return 0
}

// histogramOf is the histogram name's sample count and sum.
func histogramOf(t *testing.T, reg prometheus.Gatherer, name string) (uint64, float64) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no %s", name)
	return 0, 0
}
