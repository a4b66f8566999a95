package service

import (
	"context"
	"fmt"
)

// ledger is what a bucket has handed out that a caller may give back: per
// caller, the tokens granted by leases and not yet returned, and the tokens
// reserved by admitted decisions of a refundable rule and not yet refunded.
// It lives in the bucket's own record (bucket.lua writes the same fields,
// with the same arithmetic) and is changed in the same atomic step as the
// bucket, so a caller's return is clamped to the grants outstanding to that
// caller and its refund to the reservations outstanding to that caller: no
// call gives back what its caller did not take.
//
// Each caller's sides are kept in two generations of one window: what was
// handed out in the current window and in the previous one. When the window
// turns, the current generation becomes the previous one and the previous
// one is dropped; a window skipped drops both. So a grant or a reservation
// can be given back for at least one window and at most two, oldest first.
// A caller with nothing outstanding is dropped, so a bucket holds at most
// one entry per caller that has something outstanding, and the callers are
// the names of the server's tokens (Config.Tokens, Config.Identities): the
// record's size is bounded by the token file. The zero ledger holds nothing.
//
// Returns and refunds are also bounded in rate. A bucket takes back at most
// its burst of returns per window (returned), whoever returns: a gateway
// returns only the unspent rest of a lease that went idle, so honest returns
// rarely reach it (and when they do, the bucket is only short), while
// without it a caller could return every grant as soon as it is made and
// the gateways, which spend their grants without telling the service, would
// be granted the same tokens again and again. A bucket takes back in refunds
// per window at most what refundable decisions reserved in that window plus
// a burst (reserved, refunded): honest refunds grow with the traffic (a rule
// reserving 10 for responses that cost 1 refunds 9 a request; charge_on
// refunds every response it does not list), and they come soon after their
// reservation, so they fit; what the budget stops is a caller keeping
// reservations over windows and giving them back all at once into another
// gateway's burst, which gives back at most a burst per window. A caller's
// own reservations it may refund as fast as it makes them: that lets its own
// requests through, which it could do by not asking at all.
type ledger struct {
	gen      int64   // index of the current window: now / window
	returned float64 // returns taken back in the current window
	reserved float64 // reservations recorded in the current window
	refunded float64 // refunds taken back in the current window
	callers  []callerLedger
}

// callerLedger is one caller's part of a ledger.
type callerLedger struct {
	name  string
	lease [2]float64 // granted, not yet returned: [current, previous]
	resv  [2]float64 // reserved, not yet refunded: [current, previous]
}

// empty reports whether c has nothing outstanding.
func (c *callerLedger) empty() bool {
	return c.lease == [2]float64{} && c.resv == [2]float64{}
}

// at returns l as seen at now (Unix ns) for a window of window ns: the
// generations turned as many times as windows passed, callers with nothing
// left dropped. A clock that went backwards keeps l as it is. The result
// shares nothing with l.
func (l ledger) at(now, window int64) ledger {
	gen := now / window
	out := ledger{gen: gen}
	switch {
	case gen <= l.gen:
		out.gen, out.returned, out.reserved, out.refunded = l.gen, l.returned, l.reserved, l.refunded
		for _, c := range l.callers {
			if !c.empty() {
				out.callers = append(out.callers, c)
			}
		}
	case gen == l.gen+1:
		for _, c := range l.callers {
			n := callerLedger{name: c.name, lease: [2]float64{0, c.lease[0]}, resv: [2]float64{0, c.resv[0]}}
			if !n.empty() {
				out.callers = append(out.callers, n)
			}
		}
	}
	return out
}

// of returns caller's part of l, added (empty) when l has none.
func (l *ledger) of(caller string) *callerLedger {
	for i := range l.callers {
		if l.callers[i].name == caller {
			return &l.callers[i]
		}
	}
	l.callers = append(l.callers, callerLedger{name: caller})
	return &l.callers[len(l.callers)-1]
}

// find returns caller's part of l, or nil.
func (l *ledger) find(caller string) *callerLedger {
	for i := range l.callers {
		if l.callers[i].name == caller {
			return &l.callers[i]
		}
	}
	return nil
}

// reserve records x reserved by caller's admitted decision.
func (l *ledger) reserve(caller string, x float64) {
	l.of(caller).resv[0] += x
	l.reserved += x
}

// grant records x granted to caller by a lease.
func (l *ledger) grant(caller string, x float64) { l.of(caller).lease[0] += x }

// give takes up to x (>= 0) from side, previous generation first, and
// returns what it took.
func give(side *[2]float64, x float64) float64 {
	if !(x > 0) {
		return 0
	}
	took := 0.0
	for _, g := range []int{1, 0} {
		t := min(x-took, side[g])
		if t > 0 {
			side[g] -= t
			took += t
		}
	}
	return took
}

// takeReturn takes back up to ret (>= 0) of caller's lease return for a
// bucket of burst: at most what the window's return budget has left, and at
// most the grants outstanding to caller. It returns what it took.
func (l *ledger) takeReturn(caller string, ret, burst float64) float64 {
	c := l.find(caller)
	if c == nil {
		return 0
	}
	took := give(&c.lease, min(ret, burst-l.returned))
	l.returned += took
	return took
}

// takeRefund takes back up to ref (>= 0) of caller's refund for a bucket of
// burst: at most what the window's refund budget has left (what the window
// reserved, plus a burst, less what it refunded), and at most the
// reservations outstanding to caller. It returns what it took.
func (l *ledger) takeRefund(caller string, ref, burst float64) float64 {
	c := l.find(caller)
	if c == nil {
		return 0
	}
	took := give(&c.resv, min(ref, burst+l.reserved-l.refunded))
	l.refunded += took
	return took
}

// DefaultCaller names the caller of a call that carries no name: a server
// without tokens, or a Store used directly. Every such call is one caller.
const DefaultCaller = "default"

// MaxCallerBytes bounds a caller's name.
const MaxCallerBytes = 64

type callerKey struct{}

// WithCaller returns ctx naming caller as the caller of the store calls made
// with it: a refund or a return gives back only what that caller reserved
// or was granted. Server sets it from the call's token; a name is 1 to
// MaxCallerBytes printable ASCII bytes without spaces (CheckCaller).
func WithCaller(ctx context.Context, caller string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller)
}

// callerOf returns the caller ctx names, DefaultCaller when none, or an
// error for a name a store cannot record.
func callerOf(ctx context.Context) (string, error) {
	c, ok := ctx.Value(callerKey{}).(string)
	if !ok {
		return DefaultCaller, nil
	}
	if err := CheckCaller(c); err != nil {
		return "", err
	}
	return c, nil
}

// CheckCaller refuses a caller name a store cannot record: empty, longer
// than MaxCallerBytes, or holding a byte outside printable ASCII or a space
// (the Redis record separates fields with spaces).
func CheckCaller(name string) error {
	if name == "" || len(name) > MaxCallerBytes {
		return fmt.Errorf("service: caller: must be 1 to %d bytes, got %d", MaxCallerBytes, len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("service: caller: %q: only printable ASCII without spaces", name)
		}
	}
	return nil
}
