package rlqs

import (
	"math"
	"slices"
	"sync"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Spare is the part of a limit's rate the allocator never assigns: it
// refills the limit's free tokens, which pay for every new Envoy bucket's
// max_tokens (see Allocator).
const Spare = 0.05

// MinTTLReports is the least number of reporting intervals an assignment
// lives: it outlives a late report or two.
const MinTTLReports = 3

// maxCommits bounds the assignments one holder keeps counted: past it, the
// holder's last shape is sent again (or DENY_ALL), never a new one.
const maxCommits = 8

// maxCallerGrants bounds the holders of one caller a limit keeps, ended
// streams' included until their assignments lapse (so memory and the work
// of each assignment): a caller churning streams faster gets DENY_ALL for
// its new ones.
const maxCallerGrants = 4 * MaxStreamsPerCaller

// sweepEvery is how many Assign calls pass between two sweeps of the
// ledgers no holder counts on any more.
const sweepEvery = 1024

// Limit is a limit as the allocator divides it: the store's bucket key
// names it, its rate is in tokens a second and its burst in tokens.
type Limit struct {
	Key   string
	Rate  float64
	Burst float64
}

// Holder is one Envoy bucket on one stream: what an assignment is sent to.
type Holder struct {
	Stream uint64
	Caller string
	Bucket string // the bucket_id's canonical form
}

// AllocOptions configure an Allocator.
type AllocOptions struct {
	// TTL is an assignment's least life (DefaultTTL), raised to
	// MinTTLReports reporting intervals, at most MaxTTL; whole seconds.
	TTL time.Duration
	// Grace (DefaultGrace) is the longest an assignment takes to reach
	// Envoy: each is counted for TTL + Grace from when it is sent.
	Grace time.Duration
	// Replicas (at least 1) is the number of limitd processes serving the
	// quota service over one set of limits: each divides 1/Replicas of
	// every limit's rate and burst.
	Replicas int
}

// Allocator divides each limit's rate and burst between the Envoy buckets
// that report it, without leasing tokens: what is counted are the
// assignments in force. Its model:
//
//   - Every token_bucket assignment sent is a commitment, counted (its
//     rate and its max_tokens) from when it is sent until its TTL plus the
//     grace has passed, whether it was replaced since or its stream ended:
//     Envoy may never have received what replaced it. A holder's
//     commitments count for the largest rate and the largest max_tokens
//     among them, since Envoy runs one of them at a time per bucket.
//   - At every moment the rates counted for a limit sum to at most
//     (1 − Spare) of its rate, and the max_tokens counted to at most its
//     burst (each divided by Replicas). A new assignment fits in what the
//     others' commitments leave (to a new holder: and the fair shares of
//     the holders still reporting, given them yet or not), and within what
//     its caller's other holders, ended ones included, leave of the
//     caller's share.
//   - Each limit has free tokens, at most its burst, refilled at its rate
//     less the rates counted (so at least Spare of it). An assignment that
//     makes Envoy start a new, full bucket (any shape but the one in force
//     sent again before that one lapses) is paid for: its max_tokens are
//     taken from the free tokens, and a shape whose max_tokens cannot be
//     paid is not sent.
//
// So the tokens in Envoy's buckets, plus what they admitted, plus the free
// tokens, never grow faster than the limit's rate, and start at its burst:
// the fleet admits at most burst + rate × t (docs/rate-limit-quota.md,
// "The bound"). A shrinking holder keeps the shape in force, sent with a
// TTL that adds nothing to its count, until its last report before it
// lapses. Time is passed in; methods are safe for concurrent use; the zero
// value is not usable (NewAllocator).
type Allocator struct {
	opts   AllocOptions
	shares *shares

	mu      sync.Mutex
	ledgers map[string]*ledger
	calls   int
}

// ledger is one limit's commitments and free tokens.
type ledger struct {
	lim    Limit // this replica's part
	free   float64
	at     time.Time // of free
	grants map[Holder]*grant
}

// grant is what one holder was sent for a limit.
type grant struct {
	live    bool    // the holder's stream is open and the bucket kept
	frac    float64 // its fair share of the limit at its last report
	last    shape
	sentAt  time.Time // of last
	ttl     time.Duration
	commits []commit // token buckets still counted
}

// commit is one token bucket sent, counted until end.
type commit struct {
	sh  shape
	end time.Time
}

// NewAllocator returns an Allocator for opts.
func NewAllocator(opts AllocOptions) *Allocator {
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	opts.Replicas = max(opts.Replicas, 1)
	return &Allocator{opts: opts, shares: newShares(), ledgers: map[string]*ledger{}}
}

// TTL is the life of an assignment to a bucket reported every interval.
func (a *Allocator) TTL(interval time.Duration) time.Duration {
	ttl := max(a.opts.TTL, min(MinTTLReports*interval, MaxTTL), time.Second)
	return ttl.Truncate(time.Second)
}

// Assign records h's demand (requests a second) of lim, reported over
// interval, and returns the shape to send h at now and its TTL. The shape
// is a token bucket, or DENY_ALL when nothing can be given yet.
func (a *Allocator) Assign(lim Limit, h Holder, demand float64, interval time.Duration, now time.Time) (shape, time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.calls++; a.calls >= sweepEvery {
		a.calls = 0
		a.sweep(now)
	}
	l := a.ledger(lim, now)
	ttl := a.TTL(interval)
	life := ttl + a.opts.Grace
	frac, callerFrac := a.shares.set(lim.Key, h.Stream, h.Caller, demand, l.lim.Rate, now, 2*life+interval)
	g := l.grants[h]
	if g == nil {
		if l.callerGrants(h.Caller) >= maxCallerGrants {
			// The caller's streams of this limit, ended ones still counted
			// included, are at their bound: nothing new until some lapse.
			return shape{blanket: typev3.RateLimitStrategy_DENY_ALL}, ttl
		}
		g = &grant{}
		l.grants[h] = g
	}
	g.live, g.frac = true, frac
	rate := l.lim.Rate * (1 - Spare)
	// Room: what the other holders' commitments leave, and what the other
	// holders of h's caller leave of the caller's part (the commitments of
	// its ended streams count there until they lapse). To a holder without
	// a bucket in force (a new stream), a holder still reporting holds its
	// fair share too, taken or not, so that new streams, ended since, cannot
	// keep it from it.
	// Envoy keeps its bucket when the shape in force is sent again before it
	// lapses there (its TTL from when it arrived, after it was sent).
	inForce := g.last.max > 0 && !now.Add(a.opts.Grace).After(g.sentAt.Add(g.ttl))
	oRate, oMax, cRate := 0.0, 0.0, 0.0
	for oh, og := range l.grants {
		if og == g {
			continue
		}
		r, m := og.counted()
		if !inForce && og.live && now.Sub(og.sentAt) <= 2*life {
			r = math.Max(r, og.frac*rate)
			m = math.Max(m, math.Floor(og.frac*l.lim.Burst*(1-Reserve)))
		}
		oRate += r
		oMax += m
		if oh.Caller == h.Caller {
			cRate += r
		}
	}
	roomRate := math.Min(rate-oRate, callerFrac*rate-cRate)
	roomMax := l.lim.Burst - oMax
	// max_tokens: the share of the burst, but no more than twice what the
	// holder asks over two reports, so that a burst it does not ask stays
	// in the free tokens, for new buckets.
	want := a.fit(frac*rate, math.Min(frac*l.lim.Burst*(1-Reserve), math.Max(1, 4*demand*max(interval, time.Second).Seconds())))
	// A holder with a bucket in force leaves Reserve of the free tokens to
	// the holders without one, unless it shrinks (what it gives up goes to
	// the others).
	payable := l.free
	if inForce && want.rate() >= 0.85*g.last.rate() {
		payable *= 1 - Reserve
	}
	fits := func(sh shape) bool { return sh.rate() <= roomRate && float64(sh.max) <= roomMax }
	keep := inForce && fits(g.last)
	if keep && want.rate() < 0.85*g.last.rate() {
		// Shrinking: the bucket in force goes on, not counted any longer
		// than it is already (the room it gives up opens only then), while
		// the next report still comes before it lapses.
		if ttl, ok := a.shrinkLater(g, interval, now); ok {
			g.sentAt, g.ttl = now, ttl
			return g.last, ttl
		}
	}
	var sh shape
	if keep && (near(want, g.last) || len(g.commits) >= maxCommits) {
		sh = g.last
	} else {
		sh = a.fit(math.Min(want.rate(), roomRate), math.Min(float64(want.max), math.Min(roomMax, payable)))
		if math.Min(roomMax, payable) < 1 || len(g.commits) >= maxCommits {
			sh = shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
		}
		// The bucket in force goes on when nothing new can be paid for,
		// when what can be is no better than it (the same rate within 15%
		// and not twice its max_tokens) or when growing finds no room.
		if keep && (sh.max == 0 || within(sh.rate(), g.last.rate()) && sh.max < 2*g.last.max ||
			want.rate() >= g.last.rate() && sh.rate() <= g.last.rate()) {
			sh = g.last
		}
	}
	if sh.max > 0 && !(inForce && sh == g.last) {
		sh = l.distinct(sh, g)
		l.free -= float64(sh.max) // a new, full bucket in Envoy
	}
	g.last, g.sentAt, g.ttl = sh, now, ttl
	if sh.max > 0 {
		g.commit(sh, now.Add(life))
	}
	return sh, ttl
}

// shrinkLater returns the TTL with which g's last shape can be sent again
// without being counted past the end it is counted to already, when that
// still outlives the next report (an interval and twice the grace).
func (a *Allocator) shrinkLater(g *grant, interval time.Duration, now time.Time) (time.Duration, bool) {
	var end time.Time
	for _, c := range g.commits {
		if c.sh == g.last {
			end = c.end
		}
	}
	ttl := end.Sub(now.Add(a.opts.Grace)).Truncate(time.Second)
	return ttl, ttl >= max(interval, time.Second)+2*a.opts.Grace
}

// Release records that h's bucket of key is no longer reported (its stream
// ended or the bucket was abandoned): its demand leaves the shares, and its
// commitments stay counted until they lapse.
func (a *Allocator) Release(key string, h Holder) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.shares.drop(key, h.Stream)
	if l := a.ledgers[key]; l != nil {
		if g := l.grants[h]; g != nil {
			g.live = false
		}
	}
}

// Counted returns the rates and the max_tokens of key's commitments in
// force at now, summed, and its free tokens.
func (a *Allocator) Counted(key string, now time.Time) (rate, maxTokens, free float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.ledgers[key]
	if l == nil {
		return 0, 0, 0
	}
	l.advance(now)
	for _, g := range l.grants {
		r, m := g.counted()
		rate += r
		maxTokens += m
	}
	return rate, maxTokens, l.free
}

// ledger returns lim's ledger brought to now, made with its free tokens at
// the burst, or with a limit changed by a reload (commitments made under
// the old one stay counted).
func (a *Allocator) ledger(lim Limit, now time.Time) *ledger {
	part := Limit{Key: lim.Key, Rate: lim.Rate / float64(a.opts.Replicas), Burst: lim.Burst / float64(a.opts.Replicas)}
	l := a.ledgers[lim.Key]
	if l == nil {
		l = &ledger{lim: part, free: part.Burst, at: now, grants: map[Holder]*grant{}}
		a.ledgers[lim.Key] = l
	}
	l.advance(now)
	if l.lim != part {
		l.lim = part
		l.free = math.Min(l.free, part.Burst)
	}
	return l
}

// sweep forgets the ledgers whose free tokens are back at the burst with
// nothing counted: a new ledger would start just so.
func (a *Allocator) sweep(now time.Time) {
	for k, l := range a.ledgers {
		l.advance(now)
		if len(l.grants) == 0 && l.free >= l.lim.Burst {
			delete(a.ledgers, k)
		}
	}
}

// advance refills l's free tokens to now at the rate left by the counted
// rates, piecewise between the commitments' ends, and forgets what lapsed.
// A clock that goes back refills nothing.
func (l *ledger) advance(now time.Time) {
	for now.After(l.at) {
		next, counted := now, 0.0
		for _, g := range l.grants {
			r := 0.0
			for _, c := range g.commits {
				if c.end.After(l.at) {
					r = math.Max(r, c.sh.rate())
					if c.end.Before(next) {
						next = c.end
					}
				}
			}
			counted += r
		}
		l.free = math.Min(l.lim.Burst, l.free+math.Max(0, l.lim.Rate-counted)*next.Sub(l.at).Seconds())
		l.at = next
	}
	for h, g := range l.grants {
		g.commits = slices.DeleteFunc(g.commits, func(c commit) bool { return !c.end.After(now) })
		if !g.live && len(g.commits) == 0 {
			delete(l.grants, h)
		}
	}
}

// callerGrants is the number of caller's holders in l.
func (l *ledger) callerGrants(caller string) int {
	n := 0
	for h := range l.grants {
		if h.Caller == caller {
			n++
		}
	}
	return n
}

// counted is the largest rate and the largest max_tokens of g's
// commitments.
func (g *grant) counted() (rate, maxTokens float64) {
	for _, c := range g.commits {
		rate = math.Max(rate, c.sh.rate())
		maxTokens = math.Max(maxTokens, float64(c.sh.max))
	}
	return rate, maxTokens
}

// commit counts sh until end (one entry per shape).
func (g *grant) commit(sh shape, end time.Time) {
	for i := range g.commits {
		if g.commits[i].sh == sh {
			if end.After(g.commits[i].end) {
				g.commits[i].end = end
			}
			return
		}
	}
	g.commits = append(g.commits, commit{sh: sh, end: end})
}

// distinct returns sh as Envoy must see it: not the same, to Envoy 1.40,
// as a bucket it may run at another rate (the holder's last shape, or any
// commitment of the limit, which a reconnected Envoy may still run), since
// Envoy keeps a bucket and its rate for a shape equal to its own in
// max_tokens, tokens_per_fill and fill_interval's nanos (not its whole
// seconds). Such a shape loses a token of max_tokens, or, at one token,
// has tokens_per_fill and fill_interval doubled (the same rate).
func (l *ledger) distinct(sh shape, g *grant) shape {
	clash := func(sh shape) bool {
		if g.last.max > 0 && sh != g.last && sh.max == g.last.max && sh.perFill == g.last.perFill {
			return true
		}
		for _, og := range l.grants {
			for _, c := range og.commits {
				if sh.max == c.sh.max && sh.perFill == c.sh.perFill && sh.fill != c.sh.fill {
					return true
				}
			}
		}
		return false
	}
	for range 2 * maxCommits {
		if !clash(sh) {
			return sh
		}
		switch {
		case sh.max > 1:
			sh.max--
		case sh.perFill <= 1<<30:
			sh.perFill, sh.fill = sh.perFill*2, sh.fill*2
		default:
			sh.perFill--
		}
	}
	return shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
}

// fit is the token bucket nearest below a rate (tokens a second) and a
// burst: tokens_per_fill over a whole-second fill_interval at most rate, and
// max_tokens at most burst but at least 1 (DENY_ALL when no token fits).
func (a *Allocator) fit(rate, burst float64) shape {
	deny := shape{blanket: typev3.RateLimitStrategy_DENY_ALL}
	if math.IsNaN(rate) || math.IsNaN(burst) || rate <= 0 || burst < 1 {
		return deny
	}
	sh := shape{max: uint32(math.Min(math.Floor(burst), math.MaxUint32))}
	switch {
	case rate >= MaxFill:
		sh.perFill, sh.fill = uint32(math.Min(math.Floor(rate), math.MaxUint32)), 1
	case rate*86400 < 1:
		return deny
	case rate*MaxFill < 1:
		sh.perFill, sh.fill = 1, int64(math.Ceil(1/rate))
	default: // the nearest rate at most rate, over intervals of 1 to MaxFill s
		best := 0.0
		for f := int64(1); f <= MaxFill; f++ {
			if n := math.Floor(rate * float64(f)); n >= 1 && n/float64(f) > best {
				best, sh.perFill, sh.fill = n/float64(f), uint32(n), f
			}
		}
	}
	return sh
}

// near reports whether a is within 15% of b in rate and max_tokens.
func near(a, b shape) bool {
	if a.max == 0 || b.max == 0 {
		return false
	}
	return within(float64(a.max), float64(b.max)) && within(a.rate(), b.rate())
}

// within reports whether x is within 15% of y.
func within(x, y float64) bool { return x >= 0.85*y && x <= 1.15*y }
