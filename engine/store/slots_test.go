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

// TestSlotsHammer: a bucket that never refills is a concurrency limit's
// slots. Workers, each with its own Table over the same shared data, take a
// slot and give it back with RefundOne: never more than max in flight, and
// every slot back at the end.
func TestSlotsHammer(t *testing.T) {
	sd := shareddata.New()
	const workers, perWorker, maxInFlight = 4, 300, 3
	lim := bucket.Limit{Rate: 0, Burst: maxInFlight}
	now := 100 * sec
	var inFlight, peak, admitted atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		tb := mustNew(t, sd, 1000)
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]bucket.Decision, 1)
			for range perWorker {
				ok, _, err := tb.Decide(now, []Request{{ID: 9, Limit: lim, Cost: 1}}, out)
				if errors.Is(err, slots.ErrContention) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					continue
				}
				admitted.Add(1)
				n := inFlight.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				inFlight.Add(-1) // before the release: the count never runs behind the table
				for tries := 0; ; tries++ {
					err := tb.RefundOne(now, Request{ID: 9, Limit: lim, Cost: 1})
					if err == nil {
						break
					}
					if !errors.Is(err, slots.ErrContention) || tries == 100 {
						t.Errorf("RefundOne: %v", err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > maxInFlight || admitted.Load() == 0 {
		t.Fatalf("peak in flight %d (max %d), admitted %d", p, maxInFlight, admitted.Load())
	}
	if got := tokensOf(t, mustNew(t, sd, 1000), 9, lim, now); got != maxInFlight {
		t.Fatalf("free slots at the end %v, want %d", got, maxInFlight)
	}
}

// TestRefundOneMissingAndFailing: a release of a bucket the table no
// longer holds gives nothing back and is no error; a write that fails is
// reported, the bucket unchanged.
func TestRefundOneMissingAndFailing(t *testing.T) {
	lim := bucket.Limit{Rate: 0, Burst: 2}
	now := 100 * sec
	tb := mustNew(t, shareddata.New(), 100)
	if err := tb.RefundOne(now, Request{ID: 4, Limit: lim, Cost: 1}); err != nil {
		t.Fatalf("RefundOne of a missing bucket: %v", err)
	}
	if got := tokensOf(t, tb, 4, lim, now); got != 2 {
		t.Fatalf("missing bucket after a release: %v, want 2 (full)", got)
	}
	sd := &failSet{SharedData: shareddata.New()}
	tb = mustNew(t, sd, 100)
	if !take(t, tb, now, Request{ID: 4, Limit: lim, Cost: 1}) {
		t.Fatal("take refused")
	}
	sd.fail = true
	if err := tb.RefundOne(now, Request{ID: 4, Limit: lim, Cost: 1}); err == nil {
		t.Fatal("RefundOne with failing writes: nil error")
	}
	sd.fail = false
	if got := tokensOf(t, tb, 4, lim, now); got != 1 {
		t.Fatalf("after a failed release: %v, want 1", got)
	}
}

type failSet struct {
	slots.SharedData
	fail bool
}

func (f *failSet) Set(key string, value []byte, cas uint32) error {
	if f.fail {
		return errors.New("shared data: no memory")
	}
	return f.SharedData.Set(key, value, cas)
}
