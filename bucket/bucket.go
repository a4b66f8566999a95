// Package bucket is the token-bucket arithmetic of the rate limiter: pure
// functions of a bucket's state, a limit, a cost and the current time.
//
// # Model
//
// A bucket holds up to Limit.Burst tokens and refills continuously at
// Limit.Rate tokens per second. Refill is lazy: a State records the tokens
// left at one moment (State.At, Unix nanoseconds), and the tokens at a later
// moment are computed from it, clamped to Burst. A request of a given cost (any
// positive number, fractions allowed) is admitted when the bucket holds at
// least that many tokens, and then takes them. Time is always a parameter:
// nothing here reads a clock.
//
// Guarantees:
//   - Over any interval [t0, t1] of the bucket's own time (State.At, which
//     only moves forward), the total cost admitted never exceeds
//     Burst + Rate × (t1 − t0), up to the slack described below.
//   - A client that paces itself at exactly the rate (cost c every c/Rate
//     seconds, on integer-nanosecond timestamps) is never rejected.
//   - A rejected Take returns its input state unchanged, so a caller has
//     nothing to write.
//   - A cost greater than Burst is always rejected.
//   - Charge (a cost known only after admission) may take the bucket into
//     debt, never below −Burst; admissions then wait the debt out. With
//     charges, the bound above gains one overshoot of at most Burst (see
//     Charge).
//   - Reserve (a take that may wait, within a bound) may take the bucket
//     into debt by at most Rate × maxWait (maxWait at most MaxWait), and
//     the request then waits until its tokens would have been there. Counted
//     at the moment each request goes on (its take plus its wait), the bound
//     above holds unchanged: a reservation is the Take that would have
//     admitted it at that moment (see Reserve).
//   - When the clock goes backwards, elapsed time counts as zero and State.At
//     never moves back, so a clock that jumps back and forth earns no extra
//     tokens (the bucket refills again once the clock passes State.At).
//
// Slack: elapsed times are whole nanoseconds, so a client pacing exactly at the
// rate can arrive up to one nanosecond "early", and float64 arithmetic drifts by
// a few units in the last place. So admission, Remaining and RetryAfter count a
// shortfall of at most one nanosecond of refill plus 1e-12 × Burst as none, and
// a bucket within 1e-12 × Burst of Burst counts as full (which also keeps
// ResetAfter and FullAt from gaining a second or a nanosecond through drift).
// Such shortfalls are forgiven, not carried: each admitted request may take up
// to one nanosecond of refill plus 2e-12 × Burst more than the exact model
// allows, far below one token for any sensible limit.
//
// # Quotas
//
// A Limit with PeriodEnd > 0 and Rate 0 is a quota: a bucket that does not
// refill continuously but is full again at each period boundary. The caller
// builds the Limit for each decision from the calendar period that holds its
// now: PeriodStart and PeriodEnd (Unix nanoseconds) are that period's
// window. A State from before PeriodStart (or read at or after PeriodEnd)
// is a full bucket: a new period starts with nothing used and any debt
// forgiven. Within the period the tokens are State.Tokens, with no refill.
// Take, Reserve (which never waits: there is no refill to wait for), Charge,
// Refund, Cancel and Lease keep their meaning, debt bounded by −Burst as
// above; so over one period the total taken is at most Burst, plus one
// overshoot of at most Burst from charges. The waits count to the boundary:
// RetryAfter and ResetAfter are PeriodEnd − now, and FullAt of a used State is
// PeriodEnd. A charge or refund counts in the period in which it is made.
//
// # Zero values
//
// The zero State (At == 0) is a full bucket that has never been used, so a
// missing entry in storage needs no initialisation (any At <= 0 reads as full). Times at or below 0 are
// treated as 1 ns after the epoch, so Take never produces a state with At == 0.
// A Limit needs a finite Rate > 0 and Burst > 0; with other values the
// functions do not panic and never produce NaN or a debt (negative tokens), but admit
// nothing of positive cost (Burst not finite and positive) or never refill
// (Rate not finite and positive).
//
// # Concurrency
//
// Limit, State and Decision are plain values; the functions share no state and
// are safe to call from any number of goroutines. Making a read-decide-write on
// one stored bucket atomic is the caller's job (package store does it with
// compare-and-swap).
//
// # Encoding
//
// State.AppendBinary writes EncodedLen (16) bytes, little-endian: the IEEE 754
// bits of Tokens as a uint64, then At as an int64. DecodeState reads them back
// and rejects what no valid state encodes to: a wrong length, NaN, infinite or
// tokens below −MaxDebt, a negative At, or tokens with At == 0. Negative
// tokens are a debt left by Charge. Sixteen zero bytes
// encode the zero State. The tokens are stored rather than derived from a timestamp
// alone, so a bucket keeps its tokens (clamped to the new burst) when a rule's
// rate or burst changes.
package bucket

import (
	"math"
	"time"
)

// Never is returned by FullAt, and as a wait in a Decision, when the bucket
// cannot refill (Rate not finite and positive) or the wait does not fit an
// int64 of nanoseconds.
const Never = math.MaxInt64

const (
	nsPerSecond = 1_000_000_000
	// relSlack is the float-drift part of the slack, relative to Burst.
	relSlack = 1e-12
)

// Limit is the shape of a token bucket: it refills at Rate tokens per second
// up to a capacity of Burst tokens. Both must be finite and positive.
type Limit struct {
	Rate  float64 // tokens per second
	Burst float64 // capacity in tokens
	// PeriodStart and PeriodEnd (Unix nanoseconds) are the window of a
	// quota's current period, making the Limit a quota when PeriodEnd > 0
	// and Rate is 0 (see Quotas in the package doc); zero for an ordinary
	// token bucket.
	PeriodStart, PeriodEnd int64
}

// Quota reports whether l is a quota: PeriodEnd > 0 and Rate 0.
func (l Limit) Quota() bool {
	return l.PeriodEnd > 0 && l.Rate == 0
}

// State is a bucket's content: Tokens left at time At (Unix nanoseconds). The
// zero value is a full bucket that has never been used.
type State struct {
	Tokens float64
	At     int64
}

// Decision is the outcome of Take. The waits are exact: whole nanoseconds,
// rounded up, measured from the now given to Take; if the clock went
// backwards they include the time until it is back at the state's time, since
// no tokens accrue before then. They are Never when the bucket cannot refill.
// Rounding to the units of an answer (seconds in headers, milliseconds on the
// wire) is the caller's, done once at the edge.
type Decision struct {
	// Allowed reports whether the request was admitted.
	Allowed bool
	// Remaining is floor(tokens after the decision): the largest whole cost
	// that would be admitted right now.
	Remaining int64
	// RetryAfter is 0 when allowed; otherwise the wait until the same request
	// would be admitted, (cost − tokens) / rate, at least 1 ns (for a cost
	// above Burst, when it would be if Burst allowed it).
	RetryAfter time.Duration
	// ResetAfter is the wait until the bucket is full again,
	// (burst − tokens after) / rate.
	ResetAfter time.Duration
	// Wait is, for a request admitted by Reserve, how long it must be held
	// before it goes on: the time until its tokens would have been there,
	// −(tokens after) / rate, at most the reservation's maxWait. It is 0 for
	// a request that may go at once and for a refused one (Take never
	// sets it).
	Wait time.Duration
}

// capacity is Burst when it is finite and positive, else 0.
func (l Limit) capacity() float64 {
	if l.Burst > 0 && l.Burst <= math.MaxFloat64 {
		return l.Burst
	}
	return 0
}

// rate is Rate when it is finite and positive, else 0.
func (l Limit) rate() float64 {
	if l.Rate > 0 && l.Rate <= math.MaxFloat64 {
		return l.Rate
	}
	return 0
}

// slack is the amount of tokens by which a threshold may be missed and still
// count as reached: one nanosecond of refill plus relSlack × Burst.
func (l Limit) slack() float64 {
	return l.rate()*1e-9 + relSlack*l.capacity()
}

// clock maps times at or below 0 to 1, keeping At == 0 for the unused bucket.
func clock(now int64) int64 {
	if now < 1 {
		return 1
	}
	return now
}

// MaxWait bounds the wait of a reservation (see Reserve): a longer maxWait
// counts as MaxWait. It also bounds how deep a stored debt is read: no
// deeper than Burst + Rate × MaxWait, so a corrupt or stale state costs a
// bucket at most that long.
const MaxWait = 60 * time.Second

// level clamps stored tokens into [−(capacity + rate × MaxWait), capacity]
// (negative tokens are a debt left by Charge or Reserve); NaN counts as 0.
func (l Limit) level(tokens float64) float64 {
	if tokens != tokens {
		return 0
	}
	c := l.capacity()
	return max(min(tokens, c), -l.floor())
}

// floor is the deepest debt a bucket may hold: one Burst of charges plus
// MaxWait of reservations. It is 0 for a limit that admits nothing.
func (l Limit) floor() float64 {
	c := l.capacity()
	if c == 0 {
		return 0
	}
	return c + l.rate()*MaxWait.Seconds()
}

// fullIn is the nanoseconds of refill that take tokens (already clamped) to
// within relSlack × capacity of capacity: 0 when already there, Never when it
// cannot refill. Only the float-drift part of the slack applies here: being
// full does not depend on nanosecond rounding.
func (l Limit) fullIn(tokens float64) int64 {
	c := l.capacity()
	return refillIn(c-tokens-relSlack*c, l.rate())
}

// refillIn is the whole nanoseconds (rounded up) it takes to refill tokens at
// rate: 0 when tokens <= 0 or NaN, Never when rate is 0 or the time too long.
func refillIn(tokens, rate float64) int64 {
	if !(tokens > 0) {
		return 0
	}
	if rate == 0 {
		return Never
	}
	ns := math.Ceil(tokens / rate * nsPerSecond)
	if !(ns < 0x1p63) {
		return Never
	}
	return int64(ns)
}

// wait is in + gap nanoseconds, Never when in is Never or the sum
// overflows. Both arguments are >= 0.
func wait(in, gap int64) time.Duration {
	w := in + gap
	if in == Never || w < in {
		return Never
	}
	return time.Duration(w)
}

// Tokens returns the tokens in the bucket at time now: s refilled since s.At
// and clamped to Burst; negative while the bucket is in debt (see Charge). If now is before s.At (the clock went backwards),
// no time has elapsed.
func (l Limit) Tokens(s State, now int64) float64 {
	return l.tokensAt(s, clock(now))
}

func (l Limit) tokensAt(s State, now int64) float64 {
	c := l.capacity()
	if s.At <= 0 {
		return c
	}
	if l.Quota() {
		if s.At < l.PeriodStart || now >= l.PeriodEnd {
			return c // a new period: nothing used, any debt forgiven
		}
		return l.level(s.Tokens)
	}
	tokens := l.level(s.Tokens)
	elapsed := now - s.At
	if elapsed <= 0 {
		return tokens
	}
	refilled := tokens + l.rate()*float64(elapsed)/nsPerSecond
	// Clearly short of full: by then fullIn(tokens) > elapsed, whose float
	// error is far below relSlack × c. Near full, the exact test decides, so
	// that Tokens(s, FullAt(s)) is exactly Burst.
	if refilled < c*(1-2*relSlack) {
		return refilled
	}
	if elapsed >= l.fullIn(tokens) {
		return c
	}
	return min(refilled, c)
}

// Take decides a request of the given cost at time now. If admitted, it
// returns the state with the cost taken, at time max(now, s.At); if rejected,
// it returns s unchanged.
// A cost above Burst, or NaN, is always rejected; a cost at or below 0 takes
// nothing and is admitted.
func (l Limit) Take(s State, now int64, cost float64) (State, Decision) {
	now = clock(now)
	tokens := l.tokensAt(s, now)
	cost = max(cost, 0) // NaN stays NaN and fails the test below
	at := max(now, s.At)
	if cost <= l.capacity() && tokens+l.slack() >= cost {
		next := State{Tokens: max(tokens-cost, 0), At: at}
		return next, l.ReportAt(next.Tokens, now, at-now, cost, true)
	}
	d := l.ReportAt(tokens, now, at-now, cost, false)
	if full := l.FullAt(s); full != Never && !l.Quota() {
		// The same moment FullAt reports, not one recomputed from the refilled
		// tokens, which float rounding could put a nanosecond apart.
		d.ResetAfter = time.Duration(max(full-now, 0))
	}
	return s, d
}

// Reserve decides a request of the given cost at time now that may wait up
// to maxWait for its tokens, the semantics of golang.org/x/time/rate's
// ReserveN with a maximum delay. When the bucket holds the cost (up to the
// slack) it is Take. Otherwise the request takes its tokens now, putting
// the bucket into debt, and Decision.Wait is the time until the refill has
// paid that debt back, when its tokens would have been there; it is
// admitted when that wait is at most maxWait (clamped to [0, MaxWait]),
// so the debt never exceeds Rate × maxWait. A request that would wait
// longer is refused with s unchanged and the RetryAfter Take gives it.
// A cost above Burst, or NaN, is always refused; maxWait <= 0 is Take.
//
// Later reservations find a deeper debt, so waits end in the order the
// tokens were taken. A holder that gives up before its wait is over returns
// its tokens with Cancel, not Refund. Counted when each request goes on (now + Wait),
// admissions keep the bound Burst + Rate × elapsed: the request goes on at
// the moment its tokens are there, as if Take had admitted it then.
func (l Limit) Reserve(s State, now int64, cost float64, maxWait time.Duration) (State, Decision) {
	next, d := l.Take(s, now, cost)
	maxWait = min(maxWait, MaxWait)
	if d.Allowed || maxWait <= 0 || !(cost <= l.capacity()) || l.rate() == 0 {
		return next, d
	}
	now = clock(now)
	at := max(now, s.At)
	tokens := l.tokensAt(s, now) - max(cost, 0)
	// The wait counts from now: a clock gone backwards adds its gap, as in
	// Take's waits.
	w := wait(refillIn(-tokens, l.rate()), at-now)
	if w > maxWait {
		return s, d
	}
	next = State{Tokens: max(tokens, -l.floor()), At: at}
	d = l.ReportAt(next.Tokens, now, at-now, cost, true)
	d.Wait = w
	return next, d
}

// Cancel gives back the tokens of a request Reserve admitted with a wait,
// which gives up at time now before it goes on at goesAt (Unix
// nanoseconds: the reservation's now plus its Wait). Later holders keep
// their moments: a debt is one number, and giving back tokens that a later
// holder's moment stands on would let a new request go before it, or two go
// on together where the rate allows one. So the cost comes back whole when
// no reservation was made after this one (the bucket's debt is paid at
// goesAt, up to the slack), and nothing comes back otherwise: the tokens of
// a holder in the middle of the queue are spent, as if it had gone on.
// (golang.org/x/time/rate's Cancel gives back part of them, which moves the
// later holders' moment.) Once now has reached goesAt it is Refund.
func (l Limit) Cancel(s State, now int64, cost float64, goesAt int64) State {
	now = clock(now)
	if !(cost > 0) || s.At <= 0 || now >= goesAt {
		return l.Refund(s, now, cost)
	}
	tokens := l.tokensAt(s, now)
	// The bucket at goesAt: 0 when this holder is the last one.
	if tokens+l.rate()*float64(goesAt-now)/nsPerSecond < -l.slack()-relSlack*cost {
		return s
	}
	return State{Tokens: min(tokens+cost, l.capacity()), At: max(now, s.At)}
}

// Report is the Decision for a bucket that holds tokens after a decision on
// a request of the given cost, whose own time is gap nanoseconds ahead of the
// decision's now (gap > 0 only when the clock went backwards). Take uses it;
// so does a store that decides elsewhere (the limit service's Lua script)
// and knows only the tokens it left, so both report the same waits.
// A quota's waits count to its boundary from a now that Report does not
// know: for a quota, use ReportAt (Report answers as if now were
// PeriodStart).
func (l Limit) Report(tokens float64, gap int64, cost float64, allowed bool) Decision {
	return l.ReportAt(tokens, l.PeriodStart, gap, cost, allowed)
}

// ReportAt is Report at a known now (Unix nanoseconds). For a token bucket
// now does not matter and it is Report; for a quota the waits are
// PeriodEnd − now (RetryAfter at least 1 ns, both 0 once now has reached
// PeriodEnd but RetryAfter), whatever the tokens.
func (l Limit) ReportAt(tokens float64, now, gap int64, cost float64, allowed bool) Decision {
	tokens = l.level(tokens)
	if l.Quota() {
		left := time.Duration(max(l.PeriodEnd-now, 0))
		d := Decision{Allowed: allowed, Remaining: l.whole(tokens), ResetAfter: left}
		if !allowed {
			d.RetryAfter = max(1, left)
		}
		return d
	}
	gap = max(gap, 0)
	d := Decision{
		Allowed:    allowed,
		Remaining:  l.whole(tokens),
		ResetAfter: wait(l.fullIn(tokens), gap),
	}
	if !allowed {
		d.RetryAfter = max(1, wait(refillIn(cost-tokens-l.slack(), l.rate()), gap))
	}
	return d
}

// Refund gives cost tokens back to the bucket at time now, clamped to Burst,
// for a request that was admitted but should not count. A cost at or below 0
// (or NaN) changes nothing; so does refunding to the unused zero State, which
// is already full.
func (l Limit) Refund(s State, now int64, cost float64) State {
	if !(cost > 0) || s.At <= 0 {
		return s
	}
	now = clock(now)
	tokens := min(l.tokensAt(s, now)+cost, l.capacity())
	return State{Tokens: tokens, At: max(now, s.At)}
}

// Charge adjusts the bucket at time now by amount once a request's real
// cost is known (it reserved an estimate with Take): a positive amount takes
// more tokens, a negative one gives tokens back (clamped to Burst). Unlike
// Take it cannot refuse: the bucket goes into debt, down to −Burst at most,
// and later requests wait until the refill has paid it back (their
// RetryAfter says how long). Whatever a charge would take below −Burst is
// forgiven.
//
// The overshoot: over any interval [t0, t1] of the bucket's time, the total
// taken (admitted costs plus charges, less refunds) is at most
// Burst + Rate × (t1 − t0) + Burst: the bucket starts the interval with at
// most Burst and ends it with at least −Burst. Since no request is
// admitted while the bucket holds less than its cost, the debt comes from
// requests admitted before it arose, and however many of them charge, the
// overshoot never exceeds Burst. A NaN amount, or an amount of 0, changes
// nothing; a refund to the unused zero State, already full, changes nothing.
func (l Limit) Charge(s State, now int64, amount float64) State {
	if !(amount > 0 || amount < 0) || (amount < 0 && s.At <= 0) {
		return s
	}
	now = clock(now)
	c := l.capacity()
	// A charge takes no deeper than −Burst, and leaves a deeper debt a
	// reservation made (see Reserve) where it was.
	held := l.tokensAt(s, now)
	tokens := max(min(held-amount, c), min(-c, held))
	return State{Tokens: tokens, At: max(now, s.At)}
}

// FullAt returns the time (Unix nanoseconds) from which s is a full bucket:
// Tokens(s, t) == Burst for every t >= FullAt(s). It is s.At when s is already
// full, 0 for the zero State, and Never when the bucket cannot refill. Once
// the clock has passed FullAt(s), s reads as the zero State does, so storage
// may forget it.
func (l Limit) FullAt(s State) int64 {
	if s.At <= 0 {
		return 0
	}
	if l.Quota() {
		if s.At < l.PeriodStart || l.level(s.Tokens) >= l.capacity()*(1-relSlack) {
			return s.At
		}
		return max(l.PeriodEnd, s.At)
	}
	in := l.fullIn(l.level(s.Tokens))
	if in > Never-s.At {
		return Never
	}
	return s.At + in
}

// whole is floor(tokens), counting tokens within slack of the next integer as
// reaching it, so it is the largest whole cost Take would admit.
func (l Limit) whole(tokens float64) int64 {
	w := math.Floor(min(tokens+l.slack(), l.capacity()))
	if !(w < 0x1p63) {
		return math.MaxInt64
	}
	return int64(max(w, 0))
}
