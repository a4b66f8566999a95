package lease

import (
	"math"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

const sec = int64(time.Second)

func give(t *testing.T, tb *Table, id uint64, tokens float64, now int64) {
	t.Helper()
	if _, err := tb.Update(id, now, func(r Record) (Record, bool) { r.Tokens += tokens; r.Expires = now + 2*sec; return r, true }); err != nil {
		t.Fatal(err)
	}
}

func TestSpendAllOrNone(t *testing.T) {
	sd := shareddata.New()
	tb, _ := New(sd, "t:", 64)
	give(t, tb, 1, 3, 1)
	give(t, tb, 2, 1, 1)
	out := make([]Result, 2)
	spends := []Spend{{ID: 1, Cost: 1, Stale: sec}, {ID: 2, Cost: 2, Stale: sec}}
	ok, err := tb.Spend(1, spends, out)
	if err != nil || ok || out[0].Lacked || !out[1].Lacked {
		t.Fatalf("Spend = %v, %v, %+v; want refused by lease 2 only", ok, err, out)
	}
	if r, _ := tb.Get(1, 1); r.Tokens != 3 || r.Spent != 0 {
		t.Fatalf("lease 1 after a refused spend: %+v, want untouched", r)
	}
	spends[1].Cost = 1
	if ok, err := tb.Spend(1, spends, out); !ok || err != nil {
		t.Fatalf("Spend = %v, %v", ok, err)
	}
	r1, _ := tb.Get(1, 1)
	r2, _ := tb.Get(2, 1)
	if r1.Tokens != 2 || r2.Tokens != 0 {
		t.Fatalf("leases %v and %v, want 2 and 0", r1.Tokens, r2.Tokens)
	}
}

// TestSpendRacesExact: another worker spends between this worker's read
// and write; the CAS makes this one read again, so no token is spent twice.
func TestSpendRacesExact(t *testing.T) {
	sd := shareddata.New()
	a, _ := New(sd, "t:", 64)
	b, _ := New(sd, "t:", 64)
	give(t, a, 7, 1, 1)
	sd.Once(func() {
		if ok, _ := b.Spend(1, []Spend{{ID: 7, Cost: 1, Stale: sec}}, make([]Result, 1)); !ok {
			t.Error("the other worker could not spend")
		}
	})
	ok, err := a.Spend(1, []Spend{{ID: 7, Cost: 1, Stale: sec}}, make([]Result, 1))
	if err != nil || ok {
		t.Fatalf("second spend of the one token: %v, %v; want refused", ok, err)
	}
}

// TestRefillSingleFlight: the spend that crosses half the size claims the
// refill; no other claims it until it is answered or stale.
func TestRefillSingleFlight(t *testing.T) {
	sd := shareddata.New()
	tb, _ := New(sd, "t:", 64)
	p := Policy{TTL: 2 * time.Second, Cap: 10, Stale: time.Second}
	tb.Update(3, 1, func(r Record) (Record, bool) { p.Granted(&r, 1, 0, 4, 30, time.Second, 0); return r, true })
	out := make([]Result, 1)
	claims := 0
	for i := range 4 {
		if ok, _ := tb.Spend(int64(i+2), []Spend{{ID: 3, Cost: 1, Stale: sec}}, out); !ok {
			t.Fatalf("spend %d refused", i)
		}
		if out[0].Refill != 0 {
			claims++
		}
	}
	if claims != 1 {
		t.Fatalf("%d refills claimed, want 1", claims)
	}
	give(t, tb, 3, 1, 3*sec)
	if ok, _ := tb.Spend(3*sec, []Spend{{ID: 3, Cost: 1, Stale: sec}}, out); !ok || out[0].Refill == 0 {
		t.Fatalf("a stale claim is claimed again: %v %+v", ok, out[0])
	}
}

// TestEviction: a full group evicts the lease that expires first.
func TestEviction(t *testing.T) {
	sd := shareddata.New()
	tb, _ := New(sd, "t:", 1) // one group
	for id := uint64(1); id <= slots.SlotsPerGroup; id++ {
		tb.Update(id, 1, func(r Record) (Record, bool) { r.Tokens, r.Expires = 1, int64(id)*sec; return r, true })
	}
	tb.Update(99, 1, func(r Record) (Record, bool) { r.Tokens = 5; return r, true })
	if tb.Evictions != 1 {
		t.Fatalf("evictions %d, want 1", tb.Evictions)
	}
	if r, _ := tb.Get(1, 1); r.Tokens != 0 {
		t.Fatalf("the lease that expired first is still there: %+v", r)
	}
	if r, _ := tb.Get(99, 1); r.Tokens != 5 {
		t.Fatalf("new lease %+v", r)
	}
}

// TestPolicySizes: the size follows this Envoy's spend rate over half a
// TTL, within [1, Cap].
func TestPolicySizes(t *testing.T) {
	p := Policy{TTL: 2 * time.Second, Cap: 100, Stale: time.Second}
	var r Record
	p.Granted(&r, 1*sec, 0, 25, 0, 0, 0)
	if got := p.Want(&r, 1); got != 25 {
		t.Fatalf("first want %v, want Cap/4", got)
	}
	r.Spent = 30
	p.Granted(&r, 2*sec, 0, 30, 0, 0, 0) // 30 tokens a second
	if r.Size != 30 || p.Want(&r, 1) != 30 {
		t.Fatalf("size %v, want 30 (30/s over half of 2 s)", r.Size)
	}
	r.Spent = 1000
	p.Granted(&r, 3*sec, 0, 30, 0, 0, 0)
	if r.Size != 100 {
		t.Fatalf("size %v, want the cap", r.Size)
	}
	if p.Want(&r, 150) != 150 {
		t.Fatal("want below a waiting request's cost")
	}
}

// FuzzDecodeLease: whatever bytes a slot holds, a decoded lease never holds
// a negative, infinite or NaN amount, and encoding round-trips.
func FuzzDecodeLease(f *testing.F) {
	var r Record
	r.Tokens, r.Size, r.Expires = 3, 8, 5
	b := make([]byte, RecordLen)
	encode(b, &r)
	f.Add(b)
	f.Add(make([]byte, RecordLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < RecordLen {
			return
		}
		r := decode(b[:RecordLen])
		for _, x := range []float64{r.Tokens, r.Size, r.Rate, r.Spent, r.Remaining} {
			if !(x >= 0) || math.IsInf(x, 0) {
				t.Fatalf("decoded %+v", r)
			}
		}
		again := make([]byte, RecordLen)
		encode(again, &r)
		if decode(again) != r {
			t.Fatalf("round trip changed %+v", r)
		}
	})
}
