package store

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

const sec = int64(1e9)

func take(t *testing.T, tb *Table, now int64, reqs ...Request) bool {
	t.Helper()
	out := make([]bucket.Decision, len(reqs))
	ok, _, err := tb.Decide(now, reqs, out)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return ok
}

func mustNew(t testing.TB, sd slots.SharedData, maxKeys int) *Table {
	t.Helper()
	tb, err := New(sd, "test:", maxKeys)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func TestTimeline(t *testing.T) {
	tb := mustNew(t, shareddata.New(), 100)
	lim := bucket.Limit{Rate: 1, Burst: 2}
	t0 := 1000 * sec
	steps := []struct {
		at     int64
		id     uint64
		wantOK bool
	}{
		{t0, 7, true},
		{t0, 7, true},
		{t0, 7, false},
		{t0, 8, true}, // another key is isolated
		{t0 + sec, 7, true},
		{t0 + sec, 7, false},
		{t0 + 10*sec, 7, true},
		{t0 + 10*sec, 7, true},
		{t0 + 10*sec, 7, false},
	}
	for i, s := range steps {
		if got := take(t, tb, s.at, Request{ID: s.id, Limit: lim, Cost: 1}); got != s.wantOK {
			t.Errorf("step %d: Decide(%v, id %d) = %v, want %v", i, s.at, s.id, got, s.wantOK)
		}
	}
}

// TestStackAtomic: per-key buckets of burst 5 under a global bucket of
// burst 12, hammered by several workers. Every admitted request consumed
// from both buckets and no rejected one kept a token: the global bucket's
// consumption equals the sum over the per-key buckets.
func TestStackAtomic(t *testing.T) {
	sd := shareddata.New()
	const workers = 4
	perKey := bucket.Limit{Rate: 1e-9, Burst: 5}
	global := bucket.Limit{Rate: 1e-9, Burst: 12}
	now := 50 * sec
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		tb := mustNew(t, sd, 64)
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			out := make([]bucket.Decision, 2)
			for i := 0; i < 100; i++ {
				key := uint64(1 + (i+w)%4)
				ok, _, err := tb.Decide(now, []Request{{ID: key, Limit: perKey, Cost: 1}, {ID: 1 << 40, Limit: global, Cost: 1}}, out)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
				}
			}
		}(w)
	}
	wg.Wait()
	if got := admitted.Load(); got != 12 {
		t.Fatalf("admitted %d, want 12 (the global burst)", got)
	}
	tb := mustNew(t, sd, 64)
	sum := 0.0
	for key := uint64(1); key <= 4; key++ {
		sum += 5 - tokensOf(t, tb, key, perKey, now)
	}
	if g := 12 - tokensOf(t, tb, 1<<40, global, now); sum != g {
		t.Fatalf("per-key buckets consumed %v, global %v: a rejected request kept tokens", sum, g)
	}
}

func tokensOf(t *testing.T, tb *Table, id uint64, lim bucket.Limit, now int64) float64 {
	t.Helper()
	var ref slotRef
	if err := tb.load(&ref, id, now); err != nil {
		t.Fatal(err)
	}
	if !ref.slot.Found {
		return lim.Burst
	}
	return lim.Tokens(ref.before, now)
}

// TestStackRollback: the second bucket loses a race and then rejects; the
// first, already written, is refunded.
func TestStackRollback(t *testing.T) {
	sd := shareddata.New()
	a, b := mustNew(t, sd, 64), mustNew(t, sd, 64)
	perKey := bucket.Limit{Rate: 1, Burst: 5}
	global := bucket.Limit{Rate: 1, Burst: 1}
	now := 9 * sec
	globalKey := "test:16:0" // 1<<40 % 16 groups
	raced := false
	sd.BeforeSet = func(key string) {
		if key == globalKey && !raced {
			raced = true
			if !take(t, b, now, Request{ID: 1 << 40, Limit: global, Cost: 1}) {
				t.Error("b rejected on a fresh global bucket")
			}
		}
	}
	out := make([]bucket.Decision, 2)
	ok, o, err := a.Decide(now, []Request{{ID: 3, Limit: perKey, Cost: 1}, {ID: 1 << 40, Limit: global, Cost: 1}}, out)
	if err != nil || ok {
		t.Fatalf("Decide = %v, %v; want rejected after the race", ok, err)
	}
	if !raced || o.Refunds != 1 || out[1].Allowed {
		t.Fatalf("raced=%v outcome=%+v decisions=%+v", raced, o, out)
	}
	if got := tokensOf(t, a, 3, perKey, now); got != 5 {
		t.Fatalf("per-key bucket has %v tokens after rollback, want 5", got)
	}
}

// TestReclaimFull: a slot whose bucket is full again is reused without an
// eviction; a group of buckets not yet full evicts the one closest to full.
func TestReclaimAndEvict(t *testing.T) {
	sd := shareddata.New()
	tb := mustNew(t, sd, slots.SlotsPerGroup) // one group
	lim := bucket.Limit{Rate: 1, Burst: 10}
	out := make([]bucket.Decision, 1)
	decide := func(now int64, id uint64, cost float64) Outcome {
		t.Helper()
		_, o, err := tb.Decide(now, []Request{{ID: id, Limit: lim, Cost: cost}}, out)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	now := 100 * sec
	for id := uint64(1); id <= slots.SlotsPerGroup; id++ {
		decide(now, id, float64(id)) // bucket id is full again after id seconds
	}
	if o := decide(now, 99, 1); o.Evictions != 1 {
		t.Fatalf("full group: evictions = %d, want 1", o.Evictions)
	}
	// id 1 was closest to full: it was evicted and starts full again.
	if got := tokensOf(t, tb, 1, lim, now); got != 10 {
		t.Fatalf("evicted bucket 1 has %v tokens, want a fresh 10", got)
	}
	if got := tokensOf(t, tb, 4, lim, now); got != 6 {
		t.Fatalf("bucket 4 has %v tokens, want 6 (kept)", got)
	}
	later := now + 20*sec // everything is full: reclaimed, no eviction
	if o := decide(later, 1234, 1); o.Evictions != 0 {
		t.Fatalf("reclaiming a full bucket counted %d evictions", o.Evictions)
	}
}

// alwaysMismatch loses every write.
type alwaysMismatch struct{ *shareddata.Envoy }

func (a alwaysMismatch) Set(string, []byte, uint32) error { return slots.ErrCASMismatch }

func BenchmarkDecide(b *testing.B) {
	tb := mustNew(b, shareddata.New(), 100000)
	reqs := []Request{{ID: 12345, Limit: bucket.Limit{Rate: 1e9, Burst: 1e9}, Cost: 1}}
	out := make([]bucket.Decision, 1)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, _, err := tb.Decide(int64(i)+sec, reqs, out); err != nil {
			b.Fatal(err)
		}
	}
}

// TestChargeHammer: workers reserve 1 token each and then charge the rest
// of a real cost of 3, concurrently through their own tables over one
// shared data. Every charge lands exactly (no lost update): the bucket ends
// at burst − 3 × admitted, floored at −burst, and nothing is admitted
// while it holds less than the reservation.
func TestChargeHammer(t *testing.T) {
	sd := shareddata.New()
	const workers, perWorker, burst = 4, 100, 40
	lim := bucket.Limit{Rate: 1e-9, Burst: burst}
	now := 100 * sec
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		tb := mustNew(t, sd, 1000)
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]bucket.Decision, 1)
			for i := 0; i < perWorker; i++ {
				ok, _, err := tb.Decide(now, []Request{{ID: 5, Limit: lim, Cost: 1}}, out)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					continue
				}
				admitted.Add(1)
				if n, _, err := tb.Charge(now, []Request{{ID: 5, Limit: lim, Cost: 2}}, nil); err != nil || n != 1 {
					t.Errorf("Charge = %d, %v", n, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	a := float64(admitted.Load())
	got := tokensOf(t, mustNew(t, sd, 1000), 5, lim, now)
	if want := max(burst-3*a, -burst); got != want {
		t.Fatalf("admitted %v: tokens %v, want %v", a, got, want)
	}
	// Every reservation found at least 1 token. One at a time, at most 14
	// of cost 3 fit in 40 (13 leave 1, the 14th is admitted with 1 and
	// drives it to -2); concurrently, a reservation may also count on the
	// charges (2 tokens each) of the other workers' admitted requests that
	// have not landed yet, one per worker: the k-th is admitted only if
	// 40 − 3(k−1) + 2 × (workers − 1) ≥ 1.
	maxAdmitted := float64(1 + (burst-1+2*(workers-1))/3)
	if a < 1 || a > maxAdmitted {
		t.Fatalf("admitted %v, want 1 to %v", a, maxAdmitted)
	}
}

func TestChargeRefundAndMissing(t *testing.T) {
	tb := mustNew(t, shareddata.New(), 100)
	lim := bucket.Limit{Rate: 1, Burst: 10}
	now := 100 * sec
	// A refund of a bucket the table does not hold writes nothing.
	if n, _, err := tb.Charge(now, []Request{{ID: 3, Limit: lim, Cost: -4}}, nil); n != 0 || err != nil {
		t.Fatalf("refund of a missing bucket = %d, %v", n, err)
	}
	// A debit of one starts it from full.
	out := make([]bucket.Decision, 1)
	if n, _, err := tb.Charge(now, []Request{{ID: 3, Limit: lim, Cost: 4}}, out); n != 1 || err != nil {
		t.Fatalf("debit = %d, %v", n, err)
	}
	if out[0].Remaining != 6 || !out[0].Allowed || out[0].ResetAfter != 4e9 {
		t.Fatalf("decision after the debit = %+v, want 6 remaining, full in 4 s", out[0])
	}
	if got := tokensOf(t, tb, 3, lim, now); got != 6 {
		t.Fatalf("tokens = %v, want 6", got)
	}
	if n, _, _ := tb.Charge(now, []Request{{ID: 3, Limit: lim, Cost: -3}, {ID: 3, Limit: lim, Cost: 0}}, nil); n != 1 {
		t.Fatalf("refund wrote %d buckets, want 1", n)
	}
	if got := tokensOf(t, tb, 3, lim, now); got != 9 {
		t.Fatalf("tokens = %v, want 9", got)
	}
	if _, _, err := tb.Charge(now, []Request{{ID: 3, Limit: lim, Cost: 1}}, nil); err != nil {
		t.Fatal(err)
	}
	tb2 := mustNew(t, alwaysMismatch{shareddata.New()}, 100)
	if n, o, err := tb2.Charge(now, []Request{{ID: 3, Limit: lim, Cost: 1}}, nil); n != 0 || !errors.Is(err, slots.ErrContention) || o.Retries != MaxAttempts {
		t.Fatalf("under contention Charge = %d, %+v, %v", n, o, err)
	}
}
