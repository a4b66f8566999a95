package lease

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

var pol = Policy{TTL: 2 * time.Second, Cap: 10, Stale: time.Second, Rate: 1}

// TestReturnAfterLostRace: this worker reads an expired lease of 5 tokens
// and means to return them; before its write lands, another worker returns
// the same lease. The retry finds nothing to return, and the Change says
// so: a return computed by an earlier attempt would hand the global bucket
// 5 tokens twice (defect: a lease return that loses its compare-and-swap
// sends a stale amount).
func TestReturnAfterLostRace(t *testing.T) {
	sd := shareddata.New()
	a, _ := New(sd, "t:", 64)
	b, _ := New(sd, "t:", 64)
	give(t, a, 7, 5, 1)
	now := 5 * sec // past the 2 s expiry
	var other Change
	sd.Once(func() {
		other, _ = b.Update(7, now, func(r Record) (Record, bool) { return pol.Return(r, now, 0) })
	})
	mine, err := a.Update(7, now, func(r Record) (Record, bool) { return pol.Return(r, now, 0) })
	if err != nil {
		t.Fatal(err)
	}
	sent := 0.0
	for _, ch := range []Change{other, mine} {
		if ch.Wrote {
			sent += ch.Before.Tokens
		}
	}
	if sent != 5 {
		t.Fatalf("returned %v in all (other %+v, mine %+v), want the lease's 5 once", sent, other, mine)
	}
}

// TestRefillClaimLostToRace: this worker's spend would claim the refill;
// another worker spends and claims it first. This worker's spend, retried,
// must not report a claim (two refills would go out, and one answer would
// clear the other's marker).
func TestRefillClaimLostToRace(t *testing.T) {
	sd := shareddata.New()
	a, _ := New(sd, "t:", 64)
	b, _ := New(sd, "t:", 64)
	a.Update(3, 1, func(r Record) (Record, bool) { pol.Granted(&r, 1, 0, 4, 30, time.Second, 0); return r, true })
	a.Update(3, 1, func(r Record) (Record, bool) { r.Size = 8; return r, true })
	outB := make([]Result, 1)
	sd.Once(func() {
		if ok, _ := b.Spend(2, []Spend{{ID: 3, Cost: 1, Stale: sec}}, outB); !ok {
			t.Error("the other worker could not spend")
		}
	})
	out := make([]Result, 1)
	if ok, err := a.Spend(2, []Spend{{ID: 3, Cost: 1, Stale: sec}}, out); !ok || err != nil {
		t.Fatalf("spend: %v %v", ok, err)
	}
	if outB[0].Refill == 0 || out[0].Refill != 0 {
		t.Fatalf("claims: other %d, mine %d; want the other's only", outB[0].Refill, out[0].Refill)
	}
	// The other's answer releases its own claim; a stale release does not
	// clear a newer claim.
	r, _ := a.Get(3, 2)
	Release(&r, outB[0].Refill+1)
	if r.Pending != outB[0].Refill {
		t.Fatal("a release with another stamp cleared the marker")
	}
}

// TestMarkersAfterBackwardStep: the clock steps back 300 s after a refusal,
// a failure and a claim. None of them holds the lease for the step's length
// (defect: a refused lease gave local 429s with Retry-After 373).
func TestMarkersAfterBackwardStep(t *testing.T) {
	at := 1000 * sec
	var r Record
	pol.Refused(&r, at, 0, 0, 73*time.Second, 100*time.Second, 0)
	r.DownUntil, r.Pending, r.Tokens, r.Expires = at+int64(downFor), at, 1, at+int64(pol.TTL)
	back := at - 300*sec
	if _, refusing := pol.Refusing(&r, back, 0, 5); refusing {
		t.Error("a refusal stamped before the step still refuses")
	}
	if pol.Down(&r, back) {
		t.Error("a failure stamped before the step still counts")
	}
	if pol.InFlight(&r, back) {
		t.Error("a claim stamped before the step still holds")
	}
	if !pol.Expired(&r, back) {
		t.Error("an expiry stamped before the step keeps the tokens")
	}
	// Without the step, each holds.
	if _, refusing := pol.Refusing(&r, at, 0, 5); !refusing || !pol.Down(&r, at) || !pol.InFlight(&r, at) || pol.Expired(&r, at) {
		t.Error("markers do not hold at the time they were set")
	}
}

// TestRefusingJudgesOwnCost: after a refusal of cost 1000 when the global
// bucket held 937, a request of cost 100 still calls, and one of 1000 is
// refused with its own wait (defect: a refused large request refused later
// small ones, handing them its wait).
func TestRefusingJudgesOwnCost(t *testing.T) {
	p := Policy{TTL: 2 * time.Second, Cap: 250, Stale: time.Second, Rate: 10}
	var r Record
	p.Refused(&r, sec, 0, 937, 7*time.Second, 7*time.Second, 0)
	if _, refusing := p.Refusing(&r, sec, 0, 100); refusing {
		t.Fatal("a request the global bucket can hold is refused without a call")
	}
	wait, refusing := p.Refusing(&r, sec+int64(100*time.Millisecond), 0, 1000)
	if !refusing || wait != 6200*time.Millisecond {
		t.Fatalf("cost 1000: refusing %v, wait %v; want 6.2 s (63 tokens less 1 refilled, at 10/s)", refusing, wait)
	}
}

// TestLeaseConservation is the property: workers interleaving spends,
// refills (claims and grants), refunds and returns on shared leases, with
// another worker's write forced between a read and its write, never hand
// back or spend more than the leases were granted. For every lease:
// granted = spent + returned + held, and nothing is returned twice.
func TestLeaseConservation(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		sd := shareddata.New()
		workers := []*Table{}
		for range 3 {
			w, _ := New(sd, "t:", 4) // one group: leases share keys
			workers = append(workers, w)
		}
		granted, spent, returned := map[uint64]float64{}, map[uint64]float64{}, map[uint64]float64{}
		now := int64(sec)
		var op func(w *Table, depth int)
		op = func(w *Table, depth int) {
			id := uint64(1 + rng.IntN(3))
			if depth < 3 && rng.IntN(2) == 0 {
				other := w // another worker: a Table is one VM's, never re-entered
				for other == w {
					other = workers[rng.IntN(len(workers))]
				}
				sd.Once(func() { op(other, depth+1) })
			}
			switch rng.IntN(5) {
			case 0: // a grant answering a claimed refill
				g := float64(rng.IntN(5))
				ch, err := w.Update(id, now, func(r Record) (Record, bool) {
					pol.Granted(&r, now, 0, g, 0, 0, r.Pending)
					return r, true
				})
				if err == nil && ch.Wrote {
					granted[id] += g
				}
			case 1: // a request spending
				out := make([]Result, 1)
				c := float64(1 + rng.IntN(2))
				if ok, err := w.Spend(now, []Spend{{ID: id, Cost: c, Stale: sec}}, out); ok && err == nil {
					spent[id] += c
					if rng.IntN(3) == 0 { // a later check rejects it
						w.Refund(now, []Spend{{ID: id, Cost: c}})
						spent[id] -= c
					}
				}
			case 2: // a return on the tick
				ch, err := w.Update(id, now, func(r Record) (Record, bool) { return pol.Return(r, now, 0) })
				if err == nil && ch.Wrote {
					returned[id] += ch.Before.Tokens
				}
			case 3: // a refill claim
				w.Update(id, now, func(r Record) (Record, bool) { return pol.Claim(r, now) })
			case 4:
				now += int64(rng.IntN(3)) * sec
			}
		}
		for range 300 {
			op(workers[rng.IntN(len(workers))], 0)
			sd.BeforeSet = nil
		}
		for id := uint64(1); id <= 3; id++ {
			r, _ := workers[0].Get(id, now)
			if d := granted[id] - spent[id] - returned[id] - r.Tokens; math.Abs(d) > 1e-6 {
				t.Fatalf("seed %d lease %d: granted %v, spent %v, returned %v, held %v: %v tokens created", seed, id, granted[id], spent[id], returned[id], r.Tokens, -d)
			}
		}
	}
}
