package store

import (
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

// TestDebtEvictedLast: a group holds a bucket in debt (a cost known from
// the response) that is closer to full than a bucket of a slower rule. The
// new bucket evicts the slower rule's bucket (forgiving less than its
// burst), not the one in debt (which would forgive its debt on top).
func TestDebtEvictedLast(t *testing.T) {
	sd := shareddata.New()
	tb := mustNew(t, sd, slots.SlotsPerGroup) // one group
	fast := bucket.Limit{Rate: 10, Burst: 10}
	slow := bucket.Limit{Rate: 0.001, Burst: 10}
	now := 100 * sec
	if _, _, err := tb.Charge(now, []Request{{ID: 1, Limit: fast, Cost: 20}}, nil); err != nil { // −10: full in 2 s
		t.Fatal(err)
	}
	for id := uint64(2); id <= slots.SlotsPerGroup; id++ {
		take(t, tb, now, Request{ID: id, Limit: slow, Cost: 5}) // full in 5000 s
	}
	take(t, tb, now, Request{ID: 99, Limit: fast, Cost: 1})
	if got := tokensOf(t, tb, 1, fast, now); got != -10 {
		t.Fatalf("the bucket in debt holds %v after an eviction, want its −10 kept", got)
	}
}

// TestChargeOfZeroReports: a charge of 0 writes nothing and reports the
// bucket as it is (not a full one).
func TestChargeOfZeroReports(t *testing.T) {
	tb := mustNew(t, shareddata.New(), 64)
	lim := bucket.Limit{Rate: 1, Burst: 100}
	now := 10 * sec
	take(t, tb, now, Request{ID: 5, Limit: lim, Cost: 10})
	out := make([]bucket.Decision, 1)
	n, _, err := tb.Charge(now, []Request{{ID: 5, Limit: lim, Cost: 0}}, out)
	if err != nil || n != 0 || out[0].Remaining != 90 {
		t.Fatalf("Charge(0) = %d, %v, remaining %d; want 0 writes, 90", n, err, out[0].Remaining)
	}
}
