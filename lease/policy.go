package lease

import "time"

// Policy is one rule's lease tuning: how long leased tokens stay (TTL), the
// most one lease asks for (Cap: max_share × burst), and how long a call may
// be in flight (Stale: the service's timeout and a margin).
type Policy struct {
	TTL   time.Duration
	Cap   float64
	Stale time.Duration
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
// granted nothing), with what it said of the global bucket: remaining
// tokens and the wait until it is full. It renews the expiry, learns the
// spend rate and the next Size, and ends the refill the call had claimed.
func (p Policy) Granted(r *Record, now int64, tokens, remaining float64, reset time.Duration, claimed bool) {
	r.Tokens += tokens
	if tokens > 0 {
		r.Expires = now + int64(p.TTL)
	}
	r.Remaining, r.ResetAt = remaining, now+int64(reset)
	r.RetryAt, r.AskAt, r.DownUntil = 0, 0, 0
	if claimed {
		r.Pending = 0
	}
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

// Refused records an answer that refused at now: the global bucket lacked
// the request's cost for retry more, and held remaining.
func (p Policy) Refused(r *Record, now int64, remaining float64, retry, reset time.Duration, claimed bool) {
	r.Remaining, r.ResetAt, r.RetryAt = remaining, now+int64(reset), now+int64(retry)
	r.AskAt = now + min(int64(retry), askAgain)
	if claimed {
		r.Pending = 0
	}
}

// downFor is how long a lease waits after a failed call before a request
// that finds no token calls again (meanwhile failure_mode applies).
const downFor = int64(time.Second)

// Failed records a call that failed at now (no answer, or an unusable one).
func (p Policy) Failed(r *Record, now int64, claimed bool) {
	r.DownUntil = now + downFor
	if claimed {
		r.Pending = 0
	}
}

// Expired reports whether r holds tokens that should go back: expired, and
// no call in flight.
func (p Policy) Expired(r *Record, now int64) bool {
	return r.Tokens > 0 && r.Expires <= now && !p.InFlight(r, now)
}

// InFlight is InFlight with the policy's Stale.
func (p Policy) InFlight(r *Record, now int64) bool { return InFlight(r, now, int64(p.Stale)) }
