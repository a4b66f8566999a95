package service

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// The attacks of a caller that holds the bearer token, each replayed against
// both stores (the Redis scripts on miniredis, and the memory store): none
// may create a token.

// trustStore is a store with a settable clock.
type trustStore struct {
	name string
	st   Store
	set  func(time.Time)
}

func trustStores(t *testing.T) []trustStore {
	t.Helper()
	m, _, rs := newMini(t, RedisOptions{})
	clk := &fakeClock{}
	clk.Set(t0)
	ms := NewMemoryStore(MemoryOptions{Now: clk.Now})
	return []trustStore{
		{"redis", rs, m.SetTime},
		{"memory", ms, clk.Set},
	}
}

func mustDecide(t *testing.T, st Store, req *Request) Answer {
	t.Helper()
	a, _, err := decide(context.Background(), st, req)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustLease(t *testing.T, st Store, b LeaseBucket) LeaseAnswer {
	t.Helper()
	a, err := st.Lease(context.Background(), &LeaseRequest{Buckets: []LeaseBucket{b}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustCharge(t *testing.T, st Store, b ChargeBucket) ChargeAnswer {
	t.Helper()
	a, err := st.Charge(context.Background(), &ChargeRequest{Buckets: []ChargeBucket{b}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestAttackReturnWithoutLease: 200 lease calls {"want":5,"min":0,"return":5}
// on a bucket of burst 5 at 1/s drained by a decision grant nothing; a
// return on a key never leased refills nothing.
func TestAttackReturnWithoutLease(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			mustDecide(t, ts.st, one("drained", 1, 5, 5))
			granted := 0.0
			for range 200 {
				a := mustLease(t, ts.st, LeaseBucket{Key: "drained", Rate: 1, Burst: 5, Want: 5, Min: 0, Return: 5})
				granted += a.Buckets[0].Tokens
			}
			if granted > 0 {
				t.Errorf("200 returns of tokens never leased: granted %v tokens, want 0", granted)
			}
			if a := mustDecide(t, ts.st, one("drained", 1, 5, 1)); a.Allowed {
				t.Errorf("after the returns, a decision of 1 was admitted: %+v", a)
			}
		})
	}
}

// TestAttackReturnClampedToGrants: a return above what was leased and not
// yet returned gives back only that much, and each granted token comes back
// at most once.
func TestAttackReturnClampedToGrants(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			b := LeaseBucket{Key: "k", Rate: 1, Burst: 10, Want: 4, Min: 4}
			if a := mustLease(t, ts.st, b); a.Buckets[0].Tokens != 4 {
				t.Fatalf("grant = %+v, want 4", a)
			}
			mustDecide(t, ts.st, one("k", 1, 10, 6)) // drained
			ret := LeaseBucket{Key: "k", Rate: 1, Burst: 10, Return: 10}
			a := mustLease(t, ts.st, ret)
			if a.Buckets[0].Tokens != 0 || a.Buckets[0].Returned != 4 || a.Buckets[0].Remaining != 4 {
				t.Errorf("return 10 of 4 leased = %+v, want 4 returned, 4 remaining", a.Buckets[0])
			}
			a = mustLease(t, ts.st, ret)
			if a.Buckets[0].Returned != 0 || a.Buckets[0].Remaining != 4 {
				t.Errorf("second return = %+v, want nothing returned, 4 remaining", a.Buckets[0])
			}
		})
	}
}

// TestAttackRecycledGrants: a caller that returns every grant as soon as it
// is made (the gateways spend their grants without telling the service, so
// what they spent is still "outstanding") gets at most one burst of returns
// per ledger window: 100 rounds of grant 5 + return 5 on a bucket of 10 that
// barely refills grant at most 10 + 10 within a window, not 500.
func TestAttackRecycledGrants(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			granted := 0.0
			for range 100 {
				a := mustLease(t, ts.st, LeaseBucket{Key: "k", Rate: 0.001, Burst: 10, Want: 5})
				granted += a.Buckets[0].Tokens
				mustLease(t, ts.st, LeaseBucket{Key: "k", Rate: 0.001, Burst: 10, Return: 5})
			}
			if granted > 20 {
				t.Errorf("100 grant-and-return rounds granted %v tokens, want at most burst + one burst of returns (20)", granted)
			}
		})
	}
}

// TestAttackRefundWithoutReservation: 10 charges of -5 on a bucket drained
// by a lease (no reservation outstanding) give nothing back, and 100 pairs
// of decide cost 5 + charge -5 on it admit nothing.
func TestAttackRefundWithoutReservation(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			mustLease(t, ts.st, LeaseBucket{Key: "k", Rate: 1, Burst: 5, Want: 5, Min: 5})
			for range 10 {
				a := mustCharge(t, ts.st, ChargeBucket{Key: "k", Rate: 1, Burst: 5, Amount: -5})
				if a.Buckets[0].Applied != 0 || a.Buckets[0].Remaining != 0 {
					t.Fatalf("refund without reservation = %+v, want nothing applied", a.Buckets[0])
				}
			}
			admitted := 0.0
			for range 100 {
				if a := mustDecide(t, ts.st, one("k", 1, 5, 5)); a.Allowed {
					admitted += 5
				}
				mustCharge(t, ts.st, ChargeBucket{Key: "k", Rate: 1, Burst: 5, Amount: -5})
			}
			if admitted > 0 {
				t.Errorf("100 decide+refund pairs on a drained bucket admitted %v tokens, want 0", admitted)
			}
		})
	}
}

// TestRefundClampedToReservation: a legitimate refund (a decision that
// reserved 5, a response that cost 2) gives back 3; a second refund of the
// same reservation gives back only what is left of it.
func TestRefundClampedToReservation(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			mustDecide(t, ts.st, one("k", 1, 5, 5))
			a := mustCharge(t, ts.st, ChargeBucket{Key: "k", Rate: 1, Burst: 5, Amount: -3})
			if a.Buckets[0].Applied != -3 || a.Buckets[0].Remaining != 3 {
				t.Errorf("refund 3 of 5 reserved = %+v, want -3 applied, 3 remaining", a.Buckets[0])
			}
			a = mustCharge(t, ts.st, ChargeBucket{Key: "k", Rate: 1, Burst: 5, Amount: -5})
			if a.Buckets[0].Applied != -2 || a.Buckets[0].Remaining != 5 {
				t.Errorf("refund 5 of 2 left = %+v, want -2 applied, 5 remaining", a.Buckets[0])
			}
		})
	}
}

// TestLedgerExpires: what was granted or reserved can be given back for one
// ledger window at least and two at most; after that a return gives back
// nothing.
func TestLedgerExpires(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			// A slow bucket, so it is still drained two windows later.
			lim := LeaseBucket{Key: "k", Rate: 0.001, Burst: 100}
			g := lim
			g.Want, g.Min = 100, 100
			mustLease(t, ts.st, g)
			ts.set(t0.Add(2*DefaultLedgerWindow + time.Millisecond))
			r := lim
			r.Return = 100
			if a := mustLease(t, ts.st, r); a.Buckets[0].Returned != 0 {
				t.Errorf("return after two windows = %+v, want nothing returned", a.Buckets[0])
			}
		})
	}
}

// TestAttackForeignLimits: a caller naming other limits for an existing
// bucket addresses a bucket of its own: a cost-0 decision claiming 1e9
// tokens per second does not refill another's drained bucket, and a charge
// of 1e9 under other limits does not touch it.
func TestAttackForeignLimits(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			mustDecide(t, ts.st, one("k", 1, 5, 5))
			ts.set(t0.Add(time.Second))
			mustDecide(t, ts.st, one("k", 1e9, 5, 0))
			mustCharge(t, ts.st, ChargeBucket{Key: "k", Rate: 1e9, Burst: 5, Amount: 10})
			a := mustDecide(t, ts.st, one("k", 1, 5, 1))
			if !a.Allowed || a.Buckets[0].Remaining != 0 {
				t.Errorf("after a second: %+v, want 1 token admitted (refilled at 1/s), 0 left", a.Buckets[0])
			}
			if a := mustDecide(t, ts.st, one("k", 1, 5, 1)); a.Allowed {
				t.Errorf("a second token within the same second was admitted: %+v", a.Buckets[0])
			}
		})
	}
}

// TestChargeClampedNotRefused: a charge far above a burst (an upstream
// reporting 2e9) is taken as 2 × burst, driving the bucket into its full
// debt, instead of being refused whole.
func TestChargeClampedNotRefused(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			req, err := wire.DecodeChargeRequest([]byte(`{"buckets":[{"key":"k","tokens_per_second":10,"burst":100,"amount":2e9}]}`), Limits{})
			if err != nil {
				t.Fatal(err)
			}
			a, err := ts.st.Charge(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			// -100 tokens: 0 remaining, 20 s to full at 10/s.
			if a.Buckets[0].Applied != 200 || a.Buckets[0].Remaining != 0 || a.Buckets[0].ResetMs != 20000 {
				t.Errorf("charge 2e9 on burst 100 = %+v, want 200 applied, full in 20s", a.Buckets[0])
			}
		})
	}
}
