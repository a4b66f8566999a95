package service

// ledger is what a bucket has handed out that a caller may give back: the
// tokens granted by leases and not yet returned, and the tokens reserved by
// admitted decisions and not yet refunded. It lives in the bucket's own
// record (bucket.lua writes the same fields, with the same arithmetic) and is
// changed in the same atomic step as the bucket, so a return is clamped to
// the grants outstanding and a refund to the reservations outstanding: no
// call can give back what was never taken.
//
// Each side is kept in two generations of one window: what was handed out in
// the current window and in the previous one. When the window turns, the
// current generation becomes the previous one and the previous one is
// dropped; a window skipped drops both. So a grant or a reservation can be
// given back for at least one window and at most two, oldest first. The
// zero ledger holds nothing.
//
// Returns are also bounded in rate: a bucket takes back at most its burst of
// returns per window (returned). A gateway returns only the unspent rest of
// a lease that went idle, at most max_share × burst per lease, so honest
// returns rarely reach it (and when they do, the bucket is only short); but
// without it, a caller could return every grant as soon as it is made, and
// the gateways, which spend their grants without telling the service, would
// be granted the same tokens again and again.
type ledger struct {
	gen      int64      // index of the current window: now / window
	lease    [2]float64 // granted, not yet returned: [current, previous]
	resv     [2]float64 // reserved, not yet refunded: [current, previous]
	returned float64    // returns taken back in the current window
}

// at returns l as seen at now (Unix ns) for a window of window ns: the
// generations turned as many times as windows passed. A clock that went
// backwards keeps l as it is.
func (l ledger) at(now, window int64) ledger {
	gen := now / window
	switch {
	case gen <= l.gen:
		return l
	case gen == l.gen+1:
		return ledger{gen: gen, lease: [2]float64{0, l.lease[0]}, resv: [2]float64{0, l.resv[0]}}
	default:
		return ledger{gen: gen}
	}
}

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

// takeReturn takes back up to ret (>= 0) of a lease's return for a bucket
// of burst: at most what the window's return budget has left, and at most
// the grants outstanding. It returns what it took.
func (l *ledger) takeReturn(ret, burst float64) float64 {
	ret = min(ret, burst-l.returned)
	took := give(&l.lease, ret)
	l.returned += took
	return took
}
