package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// fakeClock is a settable clock in Unix nanoseconds.
type fakeClock struct {
	mu  sync.Mutex
	now int64
}

func (c *fakeClock) Now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t.UnixNano()
	c.mu.Unlock()
}

func TestMemoryTimeline(t *testing.T) {
	clk := &fakeClock{}
	s := NewMemoryStore(MemoryOptions{Now: clk.Now})
	ms := time.Millisecond
	steps := []struct {
		at                          time.Duration
		cost                        float64
		allowed                     bool
		remaining, retryMs, resetMs int64
		keys                        int
	}{
		{0, 1, true, 3, 0, 500, 1},
		{0, 3, true, 0, 0, 2000, 1},
		{0, 1, false, 0, 500, 2000, 1},
		{250 * ms, 1, false, 0, 250, 1750, 1},
		{500 * ms, 1, true, 0, 0, 2000, 1},
		{10 * time.Second, 0, true, 4, 0, 0, 0}, // full again: forgotten
		{10 * time.Second, 5, false, 4, 500, 0, 0},
	}
	for i, st := range steps {
		clk.Set(t0.Add(st.at))
		d, err := s.Decide(context.Background(), one("k", 2, 4, st.cost))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		b := d.Buckets[0]
		if d.Allowed != st.allowed || b.Remaining != st.remaining || b.RetryAfterMs != st.retryMs || b.ResetMs != st.resetMs {
			t.Errorf("step %d: Decide(at %v, cost %g) = %+v, want allowed %v remaining %d retry %dms reset %dms",
				i, st.at, st.cost, d, st.allowed, st.remaining, st.retryMs, st.resetMs)
		}
		if s.Len() != st.keys {
			t.Errorf("step %d: %d keys held, want %d", i, s.Len(), st.keys)
		}
	}
}

// TestMemoryMatchesRedis runs the same random multi-bucket sequences on the
// memory store and on the Lua script (miniredis) and demands identical
// decisions, waits and tokens to the bit; half the buckets may delay
// (max_delay_ms), half are refundable.
func TestMemoryMatchesRedis(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(seed, 7))
			m, _, rs := newMini(t, RedisOptions{})
			clk := &fakeClock{}
			ms := NewMemoryStore(MemoryOptions{Now: clk.Now})
			n := 1 + int(seed%3)
			req := &wire.Request{HashTag: "h", Buckets: make([]wire.Bucket, n)}
			lims := make([]bucket.Limit, n)
			for i := range n {
				lims[i] = randomLimit(r)
				req.Buckets[i].Key = "k" + strconv.Itoa(i)
			}
			nowUs := t0.UnixMicro()
			for step := range 200 {
				for i := range n {
					c := randomCost(r, lims[i])
					req.Buckets[i] = wire.Bucket{Key: req.Buckets[i].Key, Rate: lims[i].Rate, Burst: lims[i].Burst, Cost: c,
						MaxDelayMs: randomDelay(r, lims[i]), Refundable: r.IntN(2) == 0}
				}
				nowUs += randomStep(r, lims[0], req.Buckets[0].Cost, false)
				m.SetTime(time.UnixMicro(nowUs))
				clk.Set(time.UnixMicro(nowUs))
				dr, err1 := rs.Decide(context.Background(), req)
				dm, err2 := ms.Decide(context.Background(), req)
				if err1 != nil || err2 != nil {
					t.Fatalf("step %d: %v, %v", step, err1, err2)
				}
				if dr.Allowed != dm.Allowed || dr.RetryAfterMs != dm.RetryAfterMs || dr.WaitMs != dm.WaitMs {
					t.Fatalf("step %d: redis %+v, memory %+v", step, dr, dm)
				}
				for i := range dr.Buckets {
					a, b := dr.Buckets[i], dm.Buckets[i]
					if a != b || math.Float64bits(a.Tokens) != math.Float64bits(b.Tokens) {
						t.Fatalf("step %d bucket %d: redis %+v, memory %+v", step, i, a, b)
					}
				}
			}
		})
	}
}

func TestMemoryMultiBucketAtomic(t *testing.T) {
	clk := &fakeClock{now: t0.UnixNano()}
	s := NewMemoryStore(MemoryOptions{Now: clk.Now})
	req := &wire.Request{Buckets: []wire.Bucket{
		{Key: "a", Rate: 1, Burst: 1, Cost: 1},
		{Key: "b", Rate: 1, Burst: 3, Cost: 1},
	}}
	if d, _ := s.Decide(context.Background(), req); !d.Allowed {
		t.Fatalf("first decision refused: %+v", d)
	}
	d, _ := s.Decide(context.Background(), req)
	if d.Allowed || d.Buckets[0].Allowed || !d.Buckets[1].Allowed || d.Buckets[1].Remaining != 2 {
		t.Fatalf("second decision = %+v, want refused by a, b untouched at 2", d)
	}
	d, _ = s.Decide(context.Background(), one("b", 1, 3, 2))
	if !d.Allowed || d.Buckets[0].Remaining != 0 {
		t.Fatalf("b after the refused request = %+v, want 2 tokens left to take", d)
	}
}

func TestMemoryBounded(t *testing.T) {
	clk := &fakeClock{now: t0.UnixNano()}
	s := NewMemoryStore(MemoryOptions{Now: clk.Now, MaxKeys: 10})
	ctx := context.Background()
	for i := range 10 {
		if _, err := s.Decide(ctx, one("k"+strconv.Itoa(i), 1, 1, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Decide(ctx, one("new", 1, 1, 1)); !errors.Is(err, ErrMemoryFull) {
		t.Fatalf("11th key: %v, want ErrMemoryFull", err)
	}
	// Existing keys still work while full.
	if d, err := s.Decide(ctx, one("k0", 1, 1, 1)); err != nil || d.Allowed {
		t.Fatalf("k0 while full = %+v, %v; want refused (empty), no error", d, err)
	}
	// Refused decisions and cost-0 peeks on new keys need no room.
	if d, err := s.Decide(ctx, one("peek", 1, 1, 0)); err != nil || !d.Allowed {
		t.Fatalf("peek while full = %+v, %v", d, err)
	}
	clk.Set(t0.Add(time.Second)) // every bucket full again: the sweep frees them
	if _, err := s.Decide(ctx, one("new", 1, 1, 1)); err != nil {
		t.Fatalf("after refill: %v", err)
	}
	if s.Len() != 1 {
		t.Fatalf("Len = %d after the sweep, want 1", s.Len())
	}
}

func TestMemorySweepsAsItGrows(t *testing.T) {
	clk := &fakeClock{now: t0.UnixNano()}
	s := NewMemoryStore(MemoryOptions{Now: clk.Now})
	ctx := context.Background()
	for i := range 3 * minSweep {
		clk.Set(t0.Add(time.Duration(i) * 10 * time.Millisecond))
		if _, err := s.Decide(ctx, one("k"+strconv.Itoa(i), 1, 1, 1)); err != nil {
			t.Fatal(err)
		}
	}
	// Each bucket refills in 1s, i.e. 100 decisions later: sweeps keep the
	// table near minSweep rather than 3×minSweep.
	if n := s.Len(); n > minSweep+100 {
		t.Fatalf("Len = %d, want at most %d", n, minSweep+100)
	}
}

// TestMemoryHammer runs concurrent decisions on one bucket with the clock
// stopped: exactly burst are admitted.
func TestMemoryHammer(t *testing.T) {
	clk := &fakeClock{now: t0.UnixNano()}
	s := NewMemoryStore(MemoryOptions{Now: clk.Now})
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 16 {
		wg.Go(func() {
			for range 50 {
				d, err := s.Decide(context.Background(), &wire.Request{HashTag: "t", Buckets: []wire.Bucket{
					{Key: "hot", Rate: 0.01, Burst: 100, Cost: 1},
					{Key: "wide", Rate: 1, Burst: 1000, Cost: 1},
				}})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if admitted != 100 {
		t.Fatalf("admitted %d, want exactly 100", admitted)
	}
}
