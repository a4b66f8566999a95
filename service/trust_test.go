package service

import (
	"context"
	"slices"
	"strings"
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

func mustDecide(t *testing.T, st Store, req *wire.Request) wire.Answer {
	t.Helper()
	a, _, err := Decide(context.Background(), st, req)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustLease(t *testing.T, st Store, b wire.LeaseBucket) wire.LeaseAnswer {
	t.Helper()
	a, err := st.Lease(context.Background(), &wire.LeaseRequest{Buckets: []wire.LeaseBucket{b}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustCharge(t *testing.T, st Store, b wire.ChargeBucket) wire.ChargeAnswer {
	t.Helper()
	a, err := st.Charge(context.Background(), &wire.ChargeRequest{Buckets: []wire.ChargeBucket{b}})
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
				a := mustLease(t, ts.st, wire.LeaseBucket{Key: "drained", Rate: 1, Burst: 5, Want: 5, Min: 0, Return: 5})
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
			b := wire.LeaseBucket{Key: "k", Rate: 1, Burst: 10, Want: 4, Min: 4}
			if a := mustLease(t, ts.st, b); a.Buckets[0].Tokens != 4 {
				t.Fatalf("grant = %+v, want 4", a)
			}
			mustDecide(t, ts.st, one("k", 1, 10, 6)) // drained
			ret := wire.LeaseBucket{Key: "k", Rate: 1, Burst: 10, Return: 10}
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
				a := mustLease(t, ts.st, wire.LeaseBucket{Key: "k", Rate: 0.001, Burst: 10, Want: 5})
				granted += a.Buckets[0].Tokens
				mustLease(t, ts.st, wire.LeaseBucket{Key: "k", Rate: 0.001, Burst: 10, Return: 5})
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
			mustLease(t, ts.st, wire.LeaseBucket{Key: "k", Rate: 1, Burst: 5, Want: 5, Min: 5})
			for range 10 {
				a := mustCharge(t, ts.st, wire.ChargeBucket{Key: "k", Rate: 1, Burst: 5, Amount: -5})
				if a.Buckets[0].Applied != 0 || a.Buckets[0].Remaining != 0 {
					t.Fatalf("refund without reservation = %+v, want nothing applied", a.Buckets[0])
				}
			}
			admitted := 0.0
			for range 100 {
				if a := mustDecide(t, ts.st, one("k", 1, 5, 5)); a.Allowed {
					admitted += 5
				}
				mustCharge(t, ts.st, wire.ChargeBucket{Key: "k", Rate: 1, Burst: 5, Amount: -5})
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
			mustDecide(t, ts.st, refundable("k", 1, 5, 5))
			a := mustCharge(t, ts.st, wire.ChargeBucket{Key: "k", Rate: 1, Burst: 5, Amount: -3})
			if a.Buckets[0].Applied != -3 || a.Buckets[0].Remaining != 3 {
				t.Errorf("refund 3 of 5 reserved = %+v, want -3 applied, 3 remaining", a.Buckets[0])
			}
			a = mustCharge(t, ts.st, wire.ChargeBucket{Key: "k", Rate: 1, Burst: 5, Amount: -5})
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
			lim := wire.LeaseBucket{Key: "k", Rate: 0.001, Burst: 100}
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
			mustCharge(t, ts.st, wire.ChargeBucket{Key: "k", Rate: 1e9, Burst: 5, Amount: 10})
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
			req, err := wire.DecodeChargeRequest([]byte(`{"buckets":[{"key":"k","tokens_per_second":10,"burst":100,"amount":2e9}]}`), wire.Limits{})
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

// as returns ctx naming caller.
func as(caller string) context.Context { return WithCaller(context.Background(), caller) }

// TestAttackForeignRefund: the refund attack of issue 30, replayed on both
// stores. Gateway A admits on a per-request rule (nothing reserved) and on
// a refundable rule (its cost reserved as A's); gateway B, with its own
// caller name, refunds 20 on both buckets after every decision of A: it
// gives back nothing, so A's admissions stay within burst + rate × t.
func TestAttackForeignRefund(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			const rate, burst = 10.0, 20.0
			for _, key := range []string{"per-request", "refundable"} {
				admitted := 0
				now := t0
				for i := range 300 { // 3 s at one decision per 10 ms
					now = t0.Add(time.Duration(i) * 10 * time.Millisecond)
					ts.set(now)
					req := one(key, rate, burst, 1)
					req.Buckets[0].Refundable = key == "refundable"
					a, err := ts.st.Decide(as("gw-a"), req)
					if err != nil {
						t.Fatal(err)
					}
					if a.Allowed {
						admitted++
					}
					c, err := ts.st.Charge(as("gw-b"), &wire.ChargeRequest{Buckets: []wire.ChargeBucket{{Key: key, Rate: rate, Burst: burst, Amount: -20}}})
					if err != nil {
						t.Fatal(err)
					}
					if c.Buckets[0].Applied != 0 {
						t.Fatalf("%s: step %d: B's refund of A's bucket applied %v, want 0", key, i, c.Buckets[0].Applied)
					}
				}
				if bound := burst + rate*now.Sub(t0).Seconds(); float64(admitted) > bound {
					t.Errorf("%s: A admitted %d, over burst + rate × t = %v", key, admitted, bound)
				}
			}
		})
	}
}

// TestAttackForeignReturn: gateway B cannot return gateway A's grants: A's
// lease drains the bucket, B's returns give nothing back, A's own return
// does.
func TestAttackForeignReturn(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			lim := wire.LeaseBucket{Key: "k", Rate: 0.01, Burst: 10}
			g := lim
			g.Want, g.Min = 10, 10
			if a, err := ts.st.Lease(as("gw-a"), &wire.LeaseRequest{Buckets: []wire.LeaseBucket{g}}); err != nil || !a.Granted {
				t.Fatalf("A's lease = %+v, %v", a, err)
			}
			r := lim
			r.Return = 10
			for range 5 {
				a, err := ts.st.Lease(as("gw-b"), &wire.LeaseRequest{Buckets: []wire.LeaseBucket{r}})
				if err != nil || a.Buckets[0].Returned != 0 {
					t.Fatalf("B's return of A's grant = %+v, %v; want nothing returned", a, err)
				}
			}
			a, err := ts.st.Lease(as("gw-a"), &wire.LeaseRequest{Buckets: []wire.LeaseBucket{r}})
			if err != nil || a.Buckets[0].Returned != 10 {
				t.Fatalf("A's own return = %+v, %v; want 10 returned", a, err)
			}
		})
	}
}

// TestAttackBankedReservations: gateway B reserves (refundable decisions
// of 5 every 4.9 s) on a bucket of burst 10 at 1/s shared with gateway A,
// keeping it just below full (a full bucket forgets its ledger), through a
// whole window, so it holds 60 in reservations, six bursts; in the next
// window it refunds them into A's decisions of 1: the bucket takes back at
// most one burst of them (a window that reserves nothing), so A admits what
// the bucket held plus 10, not plus 60. Refunds of the window's own
// reservations stay whole: honest ones come soon after their reservation.
func TestAttackBankedReservations(t *testing.T) {
	for _, ts := range trustStores(t) {
		t.Run(ts.name, func(t *testing.T) {
			const rate, burst = 1.0, 10.0
			w := DefaultLedgerWindow
			start := t0.Truncate(w).Add(w) // a window's start
			banked, at := 0.0, time.Duration(0)
			for ; at < w; at += 4900 * time.Millisecond {
				ts.set(start.Add(at))
				if a, err := ts.st.Decide(as("gw-b"), refundable("k", rate, burst, 5)); err != nil || !a.Allowed {
					t.Fatalf("B's decision at %v: %+v, %v", at, a, err)
				}
				banked += 5
			}
			ts.set(start.Add(at)) // the next window, the bucket still short of full
			held := mustDecide(t, ts.st, one("k", rate, burst, 0)).Buckets[0].Remaining
			admitted := 0
			for range 100 {
				if a, err := ts.st.Decide(as("gw-a"), one("k", rate, burst, 1)); err != nil {
					t.Fatal(err)
				} else if a.Allowed {
					admitted++
				}
				if _, err := ts.st.Charge(as("gw-b"), &wire.ChargeRequest{Buckets: []wire.ChargeBucket{{Key: "k", Rate: rate, Burst: burst, Amount: -5}}}); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("B banked %v; A admitted %d at one instant, the bucket holding %d", banked, admitted, held)
			if banked <= 2*burst || held < 1 {
				t.Fatalf("the setup banked %v with %d held, want more than two bursts banked and a bucket not drained", banked, held)
			}
			if float64(admitted) > float64(held)+1+burst {
				t.Errorf("A admitted %d: more than the %d held + one burst of refunds (%v)", admitted, held, burst)
			}
			// In a window that reserves, its own reservations come back whole.
			ts.set(start.Add(w + 40*time.Second))
			for range 5 {
				if a := mustDecide(t, ts.st, refundable("k2", rate, burst, 10)); !a.Allowed {
					t.Fatalf("decision on k2 refused: %+v", a)
				}
				if c := mustCharge(t, ts.st, wire.ChargeBucket{Key: "k2", Rate: rate, Burst: burst, Amount: -10}); c.Buckets[0].Applied != -10 {
					t.Fatalf("an own refund in the window of its reservation: %+v, want 10 back", c.Buckets[0])
				}
			}
		})
	}
}

// TestLedgerRecordPerCaller: the Redis record holds one entry per caller
// with something outstanding, and an entry goes once its caller has settled;
// a caller name the record cannot hold is refused before Redis.
func TestLedgerRecordPerCaller(t *testing.T) {
	m, _, rs := newMini(t, RedisOptions{})
	for _, c := range []string{"gw-a", "gw-b", "gw-c"} {
		if _, err := rs.Decide(as(c), refundable("k", 0.01, 100, 10)); err != nil {
			t.Fatal(err)
		}
	}
	key := storageKey(DefaultKeyPrefix, "k", 0.01, 100)
	fields := func() []string {
		v, err := m.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(v)
	}
	if f := fields(); len(f) != 6+3*5 || f[4] != "30" || f[6] != "gw-a" || f[11] != "gw-b" || f[16] != "gw-c" {
		t.Fatalf("three callers' reservations: record %q, want 6 fields (30 reserved) and 5 per caller", f)
	}
	if _, err := rs.Charge(as("gw-b"), &wire.ChargeRequest{Buckets: []wire.ChargeBucket{{Key: "k", Rate: 0.01, Burst: 100, Amount: -10}}}); err != nil {
		t.Fatal(err)
	}
	if f := fields(); len(f) != 6+2*5 || f[5] != "10" || slices.Contains(f, "gw-b") {
		t.Fatalf("after gw-b's refund: record %q, want gw-b gone and 10 refunded", f)
	}
	for _, bad := range []string{"", "gw a", strings.Repeat("x", MaxCallerBytes+1), "gw\n"} {
		if _, err := rs.Decide(as(bad), one("k", 0.01, 100, 1)); err == nil {
			t.Errorf("caller %q: want an error", bad)
		}
	}
}
