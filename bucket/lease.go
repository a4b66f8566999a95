package bucket

// Lease decides a lease call on one bucket at time now: ret tokens come back
// first (clamped to Burst, and only into a bucket in use: the unused zero
// State is already full); then, if the bucket holds at least lo tokens (up
// to the slack), it grants min(want, tokens), never less than lo, and the
// grant is taken. ok reports whether lo was there. next is the state to
// store: with the grant taken, or when refused s with only the return
// (unchanged without one, as Take leaves a refused bucket), and d
// reports the bucket after the call for a request of cost lo.
//
// A lease is a take of a variable amount: the tokens leave the bucket when
// granted, so whatever the holder does with them, the total taken over any
// interval stays within Burst + Rate × elapsed, as for Take.
func (l Limit) Lease(s State, now int64, ret, want, lo float64) (next State, granted float64, ok bool, d Decision) {
	now = clock(now)
	s = l.Refund(s, now, ret)
	tokens := l.tokensAt(s, now)
	at := max(now, s.At)
	lo, want = max(lo, 0), max(want, 0)
	if lo <= want && want <= l.capacity() && tokens+l.slack() >= lo {
		granted = max(lo, min(want, tokens))
		// A debt (negative tokens, see Charge) stays: only lo == 0 can be
		// granted from it, and nothing is.
		next = State{Tokens: max(tokens-granted, min(tokens, 0)), At: at}
		return next, granted, true, l.ReportAt(next.Tokens, now, at-now, lo, true)
	}
	return s, 0, false, l.ReportAt(tokens, now, at-now, lo, false)
}
