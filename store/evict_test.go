package store

import (
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
)

// TestDebtEvictedLast: a group holds a bucket in debt (a cost known from
// the response) that is closer to full than a bucket of a slower rule. The
// new bucket evicts the slower rule's bucket (forgiving less than its
// burst), not the one in debt (which would forgive its debt on top).
func TestDebtEvictedLast(t *testing.T) {
	sd := newEnvoyData()
	tb := mustNew(t, sd, SlotsPerGroup) // one group
	fast := bucket.Limit{Rate: 10, Burst: 10}
	slow := bucket.Limit{Rate: 0.001, Burst: 10}
	now := 100 * sec
	if _, _, err := tb.Charge(now, []Request{{ID: 1, Limit: fast, Cost: 20}}, nil); err != nil { // −10: full in 2 s
		t.Fatal(err)
	}
	for id := uint64(2); id <= SlotsPerGroup; id++ {
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
	tb := mustNew(t, newEnvoyData(), 64)
	lim := bucket.Limit{Rate: 1, Burst: 100}
	now := 10 * sec
	take(t, tb, now, Request{ID: 5, Limit: lim, Cost: 10})
	out := make([]bucket.Decision, 1)
	n, _, err := tb.Charge(now, []Request{{ID: 5, Limit: lim, Cost: 0}}, out)
	if err != nil || n != 0 || out[0].Remaining != 90 {
		t.Fatalf("Charge(0) = %d, %v, remaining %d; want 0 writes, 90", n, err, out[0].Remaining)
	}
}

// TestSeededPlacement: workers over the same shared data share one seed;
// two Envoys (two shared data) place the same identities differently, so
// identities that share a group in one (as id % groups would for every
// Envoy) are spread in another.
func TestSeededPlacement(t *testing.T) {
	sd := newEnvoyData()
	s1, err := LoadSeed(sd, "seed")
	if err != nil {
		t.Fatal(err)
	}
	if s2, _ := LoadSeed(sd, "seed"); s2 != s1 || s1 == 0 {
		t.Fatalf("seeds %d and %d over one shared data", s1, s2)
	}
	other, _ := LoadSeed(newEnvoyData(), "seed")
	const groups = 1024
	same := 0
	for i := uint64(0); i < 64; i++ {
		id := 7 + i*groups // all in group 7 unseeded
		if Place(id, s1, groups) == Place(7, s1, groups) {
			same++
		}
	}
	if same > 4 || Place(7, s1, groups) == Place(7, other, groups) && Place(8, s1, groups) == Place(8, other, groups) {
		t.Fatalf("%d of 64 chosen identities share a group under the seed", same)
	}
}
