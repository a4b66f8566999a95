package lease

import "time"

// Policy is one rule's lease tuning: how long leased tokens stay (TTL), the
// most one lease asks for (Cap: max_share × burst), how long a call may be
// in flight (Stale: the service's lease_timeout_ms and a margin), and the global
// bucket's refill rate (tokens per second), which bounds what it can hold
// since its last answer.
type Policy struct {
	TTL   time.Duration
	Cap   float64
	Stale time.Duration
	Rate  float64
}

// Sizing: a lease asks for what this Envoy spent over half a TTL (so a busy
// lease is refilled about twice per TTL and an idle one hands back little),
// measured over windows of at least minWindow, within [1 token, Cap]; before
// any measurement it asks for Cap/4.
const minWindow = int64(100 * time.Millisecond)

// Want is what the next refill of r asks for: its Size, at least lo (the
// cost of the request that waits for it), and never more than Cap unless lo
// needs it.
func (p Policy) Want(r *Record, lo float64) float64 {
	size := r.Size
	if size <= 0 {
		size = p.Cap / 4
	}
	return max(min(size, p.Cap), lo)
}

// Granted records an answer that granted tokens at now (0 when the call
// granted nothing) of period (Record.Period: the one the call carried),
// with what it said of the global bucket: remaining tokens and the wait
// until it is full. It renews the expiry, learns the spend rate and the
// next Size, and ends the call of claim (the stamp the call's claim wrote;
// 0 for a call that claimed nothing). A grant of a later period than the
// lease's replaces what the lease held (worthless now); one of an earlier
// period is dropped, and only ends the call.
func (p Policy) Granted(r *Record, now int64, period int64, tokens, remaining float64, reset time.Duration, claim int64) {
	if !enterPeriod(r, period, claim) {
		return
	}
	r.Tokens += tokens
	if tokens > 0 {
		r.Expires = now + int64(p.TTL)
	}
	r.Remaining, r.ResetAt, r.Answered = remaining, now+int64(reset), now
	r.RetryAt, r.AskAt, r.DownUntil = 0, 0, 0
	Release(r, claim)
	switch el := now - r.Mark; {
	case r.Mark == 0 || el < 0:
		r.Mark, r.Spent = now, 0
	case el >= minWindow:
		rate := r.Spent / (float64(el) / 1e9)
		if r.Rate > 0 {
			rate = (r.Rate + rate) / 2
		}
		r.Rate, r.Mark, r.Spent = rate, now, 0
	}
	if r.Rate > 0 {
		r.Size = min(max(r.Rate*p.TTL.Seconds()/2, 1), p.Cap)
	} else if r.Size <= 0 {
		r.Size = p.Cap / 4
	}
}

// askAgain bounds how long a refused lease answers requests alone: tokens
// may come back to the global bucket sooner than its refill (other Envoys
// return theirs), so a lease asks again at least this often while refused.
const askAgain = int64(time.Second)

// Refused records an answer that refused at now, of period (as Granted's):
// the global bucket lacked the request's cost for retry more, and held
// remaining. A refusal of an earlier period than the lease's only ends the
// call; one of a later period drops what the lease held of its own.
func (p Policy) Refused(r *Record, now int64, period int64, remaining float64, retry, reset time.Duration, claim int64) {
	if !enterPeriod(r, period, claim) {
		return
	}
	r.Remaining, r.ResetAt, r.RetryAt, r.Answered = remaining, now+int64(reset), now+int64(retry), now
	r.AskAt = now + min(int64(retry), askAgain)
	Release(r, claim)
}

// Refusing reports whether a request of cost in period (as Spend's) that
// finds r short is refused without a call, and the wait to tell it: while
// the last refusal stands (AskAt) and is of the request's period, and only
// when the global bucket cannot hold cost: it held Remaining at the last
// answer and has refilled at most Rate × the time since (other Envoys only
// take from it; returns are why a refusal stands at most askAgain). A
// smaller request than the refused one still calls. A quota (Rate 0) never
// refills: its wait is the refusal's, to its period's end.
func (p Policy) Refusing(r *Record, now int64, period int64, cost float64) (time.Duration, bool) {
	if r.AskAt <= now || !within(r.AskAt, now, askAgain+1) || r.Period != period {
		return 0, false
	}
	held := r.Tokens + r.Remaining
	if el := now - r.Answered; el > 0 && r.Answered > 0 {
		held += p.Rate * float64(el) / 1e9
	}
	switch {
	case cost <= held+1e-9:
		return 0, false
	case !(p.Rate > 0):
		return min(max(time.Duration(r.RetryAt-now), time.Millisecond), maxWait), true
	}
	wait := (cost - held) / p.Rate
	if wait > float64(maxWait)/1e9 {
		return maxWait, true
	}
	return max(time.Duration(wait*1e9), time.Millisecond), true
}

// maxWait bounds the wait Refusing reports (a week, as the service's
// answers are bounded).
const maxWait = 7 * 24 * time.Hour

// Down reports whether a request that finds r short gets failure_mode
// without a call: a call failed less than downFor ago.
func (p Policy) Down(r *Record, now int64) bool {
	return r.DownUntil > now && within(r.DownUntil, now, downFor+1)
}

// downFor is how long a lease waits after a failed call before a request
// that finds no token calls again (meanwhile failure_mode applies).
const downFor = int64(time.Second)

// Failed records a call that failed at now (no answer, or an unusable one).
func (p Policy) Failed(r *Record, now int64, claim int64) {
	r.DownUntil = now + downFor
	Release(r, claim)
}

// Expired reports whether r holds tokens that should go back: expired (or
// stamped further ahead than a TTL: before a backward clock step), and no
// call in flight.
func (p Policy) Expired(r *Record, now int64) bool {
	return r.Tokens > 0 && expired(r.Expires, now, int64(p.TTL)) && !p.InFlight(r, now)
}

// InFlight is InFlight with the policy's Stale.
func (p Policy) InFlight(r *Record, now int64) bool { return InFlight(r, now, int64(p.Stale)) }

// Return is the pure update that hands r's expired tokens back: it empties
// the lease and claims its call marker for the return call. The amount to
// send is the winning attempt's Change.Before.Tokens, never more: a lease
// another worker returned or spent from meanwhile returns only what the
// write that won took out of it. Tokens of another period than period
// (the one that holds now; Record.Period) are dropped, expired or not,
// and claim nothing (the Change is not Claimed): they are not sent back.
func (p Policy) Return(r Record, now int64, period int64) (Record, bool) {
	if r.Tokens > 0 && r.Period != period {
		r.Tokens = 0
		return r, true
	}
	if !p.Expired(&r, now) {
		return r, false
	}
	r.Tokens, r.Pending = 0, max(now, 1)
	return r, true
}

// Claim is the pure update that claims r's call marker for a refill, when
// no call is in flight.
func (p Policy) Claim(r Record, now int64) (Record, bool) {
	if p.InFlight(&r, now) {
		return r, false
	}
	r.Pending = max(now, 1)
	return r, true
}

// enterPeriod moves r to the period an answer was given for: an answer of a
// later period drops what r held of its own (worthless now); one of an
// earlier period only ends the call (its claim released) and reports false.
func enterPeriod(r *Record, period, claim int64) bool {
	switch {
	case period < r.Period:
		Release(r, claim)
		return false
	case period > r.Period:
		r.Tokens, r.Period = 0, period
	}
	return true
}
