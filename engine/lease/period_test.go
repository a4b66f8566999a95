package lease

import (
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

// TestLeasePeriod: a quota's lease holds the tokens of one period
// (Record.Period): a spend of another period finds none; a grant of a
// later period replaces them, one of an earlier period is dropped (its
// call ended all the same); a refund of an earlier period credits nothing;
// Return drops an ended period's tokens, expired or not, without claiming
// a return call, and hands back the current period's once expired.
func TestLeasePeriod(t *testing.T) {
	const p1, p2 = int64(60_000), int64(120_000) // period ends, Unix ms
	pol := Policy{TTL: 2 * time.Second, Cap: 10, Stale: 2 * time.Second}
	tb, _ := New(shareddata.New(), "t:", 64)
	update := func(now int64, f func(*Record)) {
		t.Helper()
		if _, err := tb.Update(1, now, func(r Record) (Record, bool) { f(&r); return r, true }); err != nil {
			t.Fatal(err)
		}
	}
	spend := func(now, period int64) bool {
		t.Helper()
		out := make([]Result, 1)
		ok, err := tb.Spend(now, []Spend{{ID: 1, Cost: 1, Stale: sec, Period: period}}, out)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	update(50*sec, func(r *Record) { pol.Granted(r, 50*sec, p1, 5, 40, 0, 0) })
	if !spend(51*sec, p1) || spend(61*sec, p2) {
		t.Fatal("want the first period's tokens spent in it only")
	}
	update(61*sec, func(r *Record) { pol.Granted(r, 61*sec, p1, 7, 0, 0, 0) }) // a late grant of p1
	if r, _ := tb.Get(1, 61*sec); r.Held(p2) != 0 || r.Period != p1 || r.Tokens != 11 {
		t.Fatalf("after a late grant of the first period: %+v, want 11 of the first period, none of the second", r)
	}
	update(61*sec, func(r *Record) { pol.Granted(r, 61*sec, p2, 3, 37, 0, 0) })
	if r, _ := tb.Get(1, 61*sec); r.Period != p2 || r.Tokens != 3 {
		t.Fatalf("after a grant of the second period: %+v, want its 3 alone", r)
	}
	update(61*sec, func(r *Record) { pol.Granted(r, 61*sec, p1, 4, 0, 0, 0) }) // later still, of p1
	tb.Refund(61*sec, []Spend{{ID: 1, Cost: 2, Period: p1}})
	if r, _ := tb.Get(1, 61*sec); r.Period != p2 || r.Tokens != 3 {
		t.Fatalf("after a grant and a refund of the first period: %+v, want the second's 3 untouched", r)
	}
	// Return: the second period's tokens are of an ended period at p3.
	const p3 = int64(180_000)
	ch, err := tb.Update(1, 121*sec, func(r Record) (Record, bool) { return pol.Return(r, 121*sec, p3) })
	if err != nil || !ch.Wrote || ch.Claimed() || ch.After.Tokens != 0 {
		t.Fatalf("Return after the boundary = %+v, %v; want the tokens dropped, no call claimed", ch, err)
	}
	update(121*sec, func(r *Record) { pol.Granted(r, 121*sec, p3, 4, 30, 0, 0) })
	if ch, _ := tb.Update(1, 122*sec, func(r Record) (Record, bool) { return pol.Return(r, 122*sec, p3) }); ch.Wrote {
		t.Fatalf("Return of an unexpired lease of the current period = %+v, want nothing", ch)
	}
	if ch, _ := tb.Update(1, 124*sec, func(r Record) (Record, bool) { return pol.Return(r, 124*sec, p3) }); !ch.Claimed() || ch.Before.Tokens != 4 {
		t.Fatalf("Return of an expired lease of the current period = %+v, want its 4 handed back", ch)
	}
}
