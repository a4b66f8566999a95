package engine

import (
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/engine/lease"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// Cluster rules with "sync": "lease" (see package lease for the model).
//
// A request spends from its rules' leases in shared data, all or none, with
// no callout. A spend that leaves a lease below half its size claims the
// lease's refill, sent detached (the plugin owns the call), never
// holding a request. A request that finds a lease short waits for one lease
// call over all its short leases (min: its costs; want: the leases' sizes),
// unless the service failed lately (failure_mode applies at once) or the
// global bucket refused lately and cannot hold this request's cost (it is
// rejected at once, with the wait for its own cost). That call is the
// plugin's too, so its grant lands in the leases whatever becomes of the
// request; its answer goes on with the request through Stream.Run while
// the request waits. Every lease call waits at most the service's
// lease_timeout_ms. Every worker remembers the leases it called for; each
// tick it looks at a bounded number of them and hands back, in calls of up
// to wire.MaxBuckets leases, the tokens of those that expired.
//
// failure_mode applies to a lease only when it lacks the request's cost:
// a request whose lease call failed first spends what its leases hold
// (another call may have refilled them meanwhile), and under allow only
// the leases that lack its cost pass it unchecked (failed_open); the others
// are spent as usual.
//
// A cluster quota's lease belongs to one calendar period (package lease's
// model): its calls carry the period that holds now (periodOf), its grant
// is recorded as of that period (settleLeases), a request spends only its
// own period's tokens (leasePeriod), a grant answered after the boundary
// goes to no request of the new period (the waiting one calls once more:
// onLeaseAnswer), and the tick drops an ended period's tokens instead of
// returning them (returnExpired). So a period's admissions across Envoys
// never exceed its limit, and fall short of it by at most what the leases
// hold unspent at its end (under 1.5 × max_share × limit per Envoy and
// key: a refill of the lease's size is claimed below half of it).
//
// Every change to a lease is a pure function of its record (lease.Table
// runs it under compare-and-swap), and what follows a change (the amount
// returned, the refill claimed) comes from the Change of the attempt that
// won, never from an attempt that lost.

// maxHeld bounds the leases one worker remembers for returns; beyond it a
// lease's expired tokens go back only through a worker that holds it, or
// are lost to this Envoy when its slot is reused (under-admission).
const maxHeld = 4096

// returnScan bounds the held leases one tick looks at (one shared-data read
// each), so a tick's work is bounded whatever the number of keys: a full
// pass over maxHeld leases takes maxHeld/returnScan ticks.
const returnScan = 256

// heldLease is a lease this worker called for: what a return call needs.
type heldLease struct {
	id   uint64
	rule *rule
	key  string
}

// heldLeases is the leases one worker called for, with a cursor for the
// tick's bounded walk.
type heldLeases struct {
	list   []heldLease
	at     map[uint64]int // index in list
	cursor int
}

// add remembers t's lease, up to maxHeld.
func (h *heldLeases) add(t take) {
	if _, ok := h.at[t.id]; ok || len(h.list) >= maxHeld {
		return
	}
	if h.at == nil {
		h.at = map[uint64]int{}
	}
	h.at[t.id] = len(h.list)
	h.list = append(h.list, heldLease{id: t.id, rule: t.rule, key: t.key})
}

// remove forgets the lease at index i (the last one takes its place).
func (h *heldLeases) remove(i int) {
	delete(h.at, h.list[i].id)
	last := len(h.list) - 1
	if i != last {
		h.list[i] = h.list[last]
		h.at[h.list[i].id] = i
	}
	h.list[last] = heldLease{}
	h.list = h.list[:last]
}

// leasePolicy is a rule's lease tuning (compile keeps it on the rule).
func leasePolicy(cr *config.Rule) lease.Policy {
	return lease.Policy{
		TTL:   time.Duration(cr.Lease.TTLMS) * time.Millisecond,
		Cap:   cr.Lease.MaxShare * cr.Limit.Burst,
		Stale: time.Duration(cr.Service.LeaseTimeoutMS)*time.Millisecond + time.Second,
		Rate:  cr.Limit.TokensPerSecond,
	}
}

// updateLease is p.leases.Update, with its eviction counted.
func (p *Plugin) updateLease(id uint64, now int64, f func(lease.Record) (lease.Record, bool)) (lease.Change, error) {
	ch, err := p.leases.Update(id, now, f)
	if ch.Evicted {
		p.metrics.evictions.Increment(1)
	}
	return ch, err
}

// spendLeases spends the request's leased takes. It returns a rejection,
// or wait when the request waits for a lease call or is held on its
// leases (leasewait.go).
func (c *Request) spendLeases() (rej *rejection, wait bool) {
	now := c.leaseNow()
	if held, rej := c.queueOnLeases(now); held || rej != nil {
		return rej, held // behind the requests held on its leases
	}
	rej, wait = c.spendLeasesAt(now)
	if c.orHoldOnLeases(rej, now) {
		return nil, true
	}
	return rej, wait
}

// spendLeasesAt is spendLeases at now, without holding.
func (c *Request) spendLeasesAt(now int64) (rej *rejection, wait bool) {
	p, pl := c.plugin, &c.plan
	out, ok, err := c.spend(now)
	if err != nil {
		for _, t := range pl.leased {
			t.rule.failedOpen.Increment(1)
		}
		p.warn(&p.failLog, "failing open (counted in rule.<name>.failed_open): "+err.Error())
		return nil, false
	}
	for i := range out {
		p.spent(pl.leased[i], &out[i])
	}
	if ok {
		c.admitLeased(out, now)
		return nil, false
	}
	// A lease is short. Recent answers may settle the request at once.
	for i, r := range out {
		t, rec := pl.leased[i], &out[i].Record
		if !r.Lacked {
			continue
		}
		if t.rule.lease.Down(rec, now) {
			return c.leaseServiceDown(t.rule, false), false
		}
		if wait, refusing := t.rule.lease.Refusing(rec, now, leasePeriod(t.rule, now), t.cost); refusing {
			return &rejection{rule: t.rule, reason: reasonExceeded, d: bucket.Decision{
				RetryAfter: wait, ResetAfter: time.Duration(max(rec.ResetAt-now, 0))}}, false
		}
	}
	var short []take
	for i, r := range out {
		if r.Lacked {
			short = append(short, pl.leased[i])
		}
	}
	if err := c.leaseCall(short, now); err != nil {
		p.serviceFailed(short, "dispatching the lease call: "+err.Error())
		return c.leaseServiceDown(short[0].rule, false), false
	}
	if w := c.early; w != nil {
		c.early = nil
		return c.answeredAtOnce(w), false
	}
	return nil, true
}

// answeredAtOnce decides a request whose lease call the host answered
// before handing it off returned (the request never paused): the answer is
// recorded, and the request spends from its leases as they are then; a
// lease still short answers as a recorded failure or refusal does, or, when
// other requests took the grant meanwhile, refuses the request (never
// over). No second call is made.
func (c *Request) answeredAtOnce(w *leaseWait) *rejection {
	p, pl := c.plugin, &c.plan
	p.recordLeaseAnswer(w)
	now := p.now()
	if c.spendAll(now) {
		return nil
	}
	for _, t := range pl.leased {
		rec, err := p.leases.Get(t.id, now)
		if err != nil || rec.Held(leasePeriod(t.rule, now))+1e-9 >= t.cost {
			continue
		}
		if t.rule.lease.Down(&rec, now) {
			return c.leaseServiceDown(t.rule, false)
		}
		if wait, refusing := t.rule.lease.Refusing(&rec, now, leasePeriod(t.rule, now), t.cost); refusing {
			return &rejection{rule: t.rule, reason: reasonExceeded, d: bucket.Decision{
				RetryAfter: wait, ResetAfter: time.Duration(max(rec.ResetAt-now, 0))}}
		}
		return &rejection{rule: t.rule, reason: reasonExceeded, d: bucket.Decision{RetryAfter: time.Millisecond}}
	}
	return nil
}

// spent does what a spend from t's lease asks besides spending: it counts
// an eviction, and sends the refill the spend claimed.
func (p *Plugin) spent(t take, r *lease.Result) {
	if r.Evicted {
		p.metrics.evictions.Increment(1)
	}
	if r.Refill != 0 {
		p.refill(t, r.Record, r.Refill)
	}
}

// leaseServiceDown applies failure_mode for a request some of whose leases
// lack its cost while the service is failing (ru: the first such lease's
// rule). With retry (its lease call failed: another call may have filled
// the leases meanwhile), the request first spends from all its leases, all
// or none, as if no call had been needed. Then deny rejects it; allow lets
// it through, spending each lease that holds its cost (that rule still
// counts it) and passing it unchecked only on the leases that lack it
// (counted as failed open): a lease with tokens in hand is never bypassed.
func (c *Request) leaseServiceDown(ru *rule, retry bool) *rejection {
	p, pl := c.plugin, &c.plan
	now := p.now()
	if retry && c.spendAll(now) {
		return nil
	}
	return failureMode(ru, func() {
		for i := range pl.leased {
			t := &pl.leased[i]
			if t.held {
				continue
			}
			spends := append(c.scratch.spends[:0], lease.Spend{ID: t.id, Cost: t.cost, Stale: int64(t.rule.lease.Stale), Period: leasePeriod(t.rule, now)})
			c.scratch.spends = spends
			out := c.scratch.leaseResults(1)
			if ok, err := p.leases.Spend(now, spends, out); err != nil || !ok {
				t.rule.failedOpen.Increment(1)
				continue
			}
			p.spent(*t, &out[0])
			t.held, t.d, t.period = true, leaseDecision(t.rule, &out[0].Record, now), spends[0].Period
			t.rule.allowed.Increment(1)
			c.show(t.rule, t.d)
		}
	})
}

// spendAll spends the request's cost from each of its leases, all or none,
// and reports whether it did.
func (c *Request) spendAll(now int64) bool {
	out, ok, err := c.spend(now)
	if err != nil || !ok {
		return false
	}
	for i := range c.plan.leased {
		c.plugin.spent(c.plan.leased[i], &out[i])
	}
	c.admitLeased(out, now)
	return true
}

// spend spends the cost of each of the request's leased takes at now, all
// or none (lease.Table.Spend), into the request's scratch results.
func (c *Request) spend(now int64) (out []lease.Result, ok bool, err error) {
	spends := c.scratch.spends[:0]
	for _, t := range c.plan.leased {
		spends = append(spends, lease.Spend{ID: t.id, Cost: t.cost, Stale: int64(t.rule.lease.Stale), Period: leasePeriod(t.rule, now)})
	}
	c.scratch.spends = spends
	out = c.scratch.leaseResults(len(spends))
	ok, err = c.plugin.leases.Spend(now, spends, out)
	return out, ok, err
}

// admitLeased records the leased takes as held and allowed, after a spend
// of all of them (out) succeeded at now.
func (c *Request) admitLeased(out []lease.Result, now int64) {
	for i := range c.plan.leased {
		t := &c.plan.leased[i]
		t.held, t.d, t.period = true, leaseDecision(t.rule, &out[i].Record, now), leasePeriod(t.rule, now)
		t.rule.allowed.Increment(1)
		c.show(t.rule, t.d)
	}
}

// leaseWait is a request's lease call: the short leases it covers, the
// call, the marker stamps it claimed, and its answer once it came.
type leaseWait struct {
	short  []take
	req    *wire.LeaseRequest
	claims []int64
	ans    *Answer
}

// leaseCall sends the lease call a short request waits for, over its short
// leases: its cost from each at least, and each lease's size for the leases
// whose refill marker it claimed. The plugin owns the call, so its answer
// is recorded even when the request is gone (leaseAnswered).
func (c *Request) leaseCall(short []take, now int64) error {
	p := c.plugin
	req := &wire.LeaseRequest{Buckets: make([]wire.LeaseBucket, len(short))}
	claims := make([]int64, len(short))
	for i, t := range short {
		want := t.cost
		pol := t.rule.lease
		ch, err := p.updateLease(t.id, now, func(r lease.Record) (lease.Record, bool) { return pol.Claim(r, now) })
		if err == nil && ch.Claimed() {
			claims[i] = ch.After.Pending
			want = pol.Want(&ch.After, t.cost)
		}
		req.Buckets[i] = wire.LeaseBucket{Key: t.key, Rate: t.rule.limit.Rate, Burst: t.rule.limit.Burst, Want: want, Min: t.cost,
			Period: periodOf(t.rule, now)}
		p.held.add(t)
	}
	gen := c.gen
	c.calling = true
	err := p.leasePost(p.host, short[0].rule.Service, req, func(a *Answer) {
		p.leaseAnswered(c, gen, &leaseWait{short: short, req: req, claims: claims, ans: a})
	})
	c.calling = false
	if err != nil {
		c.early = nil
		p.settleLeases(short, nil, claims, req, nil, now)
	}
	return err
}

// leaseAnswered takes the answer to the lease call request c sent in its
// generation gen. While that request waits, the answer goes on with it in
// its own context (Stream.Run; Done records it if the request ends first);
// otherwise the answer is recorded in the leases, its grant whole.
func (p *Plugin) leaseAnswered(c *Request, gen uint64, w *leaseWait) {
	if c.gen == gen && c.calling {
		c.early = w // the host answered within Callout: leaseCall's caller decides
		return
	}
	if c.gen == gen && c.waiting() && c.leaseAnswer == nil {
		c.leaseAnswer = w
		err := c.stream.Run(func() {
			if c.gen == gen {
				c.takeLeaseAnswer()
			}
		})
		if err == nil {
			return
		}
		c.leaseAnswer = nil
	}
	p.recordLeaseAnswer(w)
}

// takeLeaseAnswer hands the request the answer leaseAnswered kept for it.
func (c *Request) takeLeaseAnswer() {
	w := c.leaseAnswer
	if w == nil {
		return
	}
	c.leaseAnswer = nil
	c.onLeaseAnswer(w)
}

// recordLeaseAnswer records an answer no request takes from: the whole
// grant goes into the leases.
func (p *Plugin) recordLeaseAnswer(w *leaseWait) {
	a, why := readLeaseAnswer(w.req, w.ans)
	p.settleLeases(w.short, nil, w.claims, w.req, a, p.now())
	if why != "" {
		p.serviceFailed(w.short, why)
	}
}

// onLeaseAnswer records a lease call's answer in the short leases and goes
// on with the request that waited for it: granted, the request takes its
// costs from the grants (the rest goes to the leases) and from its other
// leases, all or none; failed, it spends what its leases hold, else
// failure_mode applies. An answer that comes after Envoy answered the
// request itself puts the whole grant into the leases.
func (c *Request) onLeaseAnswer(w *leaseWait) {
	if !c.waiting() {
		c.plugin.recordLeaseAnswer(w)
		return
	}
	p, pl := c.plugin, &c.plan
	short := w.short
	now := p.now()
	a, why := readLeaseAnswer(w.req, w.ans)
	if why == "" && endedPeriod(short, w.req, now) {
		// The call's period ended before its answer came: what it granted
		// is of that period, not the request's (settleLeases keeps it in
		// the leases, where no request of another period spends it). The
		// request calls once more, for its own period; a second late
		// answer refuses it (never over).
		p.settleLeases(short, nil, w.claims, w.req, a, now)
		if c.recalled {
			c.next(&rejection{rule: short[0].rule, reason: reasonExceeded, d: bucket.Decision{RetryAfter: time.Millisecond}})
			return
		}
		c.recalled = true
		if rej, wait := c.spendLeasesAt(now); !wait {
			c.next(rej)
		}
		return
	}
	var costs []float64 // nil: the request takes nothing from the grants
	if why == "" {
		costs = make([]float64, len(short))
		for i, t := range short {
			costs[i] = t.cost
		}
	}
	recs := p.settleLeases(short, costs, w.claims, w.req, a, now)
	switch {
	case why != "":
		p.serviceFailed(short, why)
		c.next(c.leaseServiceDown(short[0].rule, true))
		return
	case !a.Granted:
		for i, g := range a.Buckets {
			if g.RetryAfterMs > 0 || i == len(a.Buckets)-1 {
				t := short[i]
				rej := &rejection{rule: t.rule, reason: reasonExceeded, d: bucket.Decision{
					Remaining: g.Remaining, RetryAfter: max(millis(g.RetryAfterMs), time.Millisecond), ResetAfter: millis(g.ResetMs)}}
				if !c.orHoldOnLeases(rej, now) {
					c.next(rej)
				}
				return
			}
		}
	}
	// The other leases had the tokens when the request looked; spend them
	// now. If another request spent them meanwhile, the grants' costs go to
	// the leases and the request is refused (under-admission, never over).
	spends := c.scratch.spends[:0]
	for _, t := range pl.leased {
		if indexOf(short, t) < 0 {
			spends = append(spends, lease.Spend{ID: t.id, Cost: t.cost, Stale: int64(t.rule.lease.Stale), Period: leasePeriod(t.rule, now)})
		}
	}
	c.scratch.spends = spends
	results := c.scratch.leaseResults(len(spends))
	ok, err := p.leases.Spend(now, spends, results)
	if err != nil || !ok {
		back := make([]lease.Spend, len(short))
		for i, t := range short {
			back[i] = lease.Spend{ID: t.id, Cost: t.cost, Period: w.req.Buckets[i].PeriodEndMs}
		}
		p.leases.Refund(now, back)
		t := short[0]
		rej := &rejection{rule: t.rule, reason: reasonExceeded, d: bucket.Decision{RetryAfter: time.Millisecond}}
		if !c.orHoldOnLeases(rej, now) {
			c.next(rej)
		}
		return
	}
	k := 0 // the next of the other leases' results
	for i := range pl.leased {
		t := &pl.leased[i]
		t.rule.allowed.Increment(1)
		t.held, t.period = true, leasePeriod(t.rule, now)
		if j := indexOf(short, *t); j >= 0 {
			t.d = leaseDecision(t.rule, &recs[j], now)
		} else {
			r := &results[k]
			p.spent(*t, r)
			t.d = leaseDecision(t.rule, &r.Record, now)
			k++
		}
		c.show(t.rule, t.d)
	}
	c.next(nil)
}

// endedPeriod reports whether the period lease call req carried for one
// of takes (a quota's) is not the one that holds now.
func endedPeriod(takes []take, req *wire.LeaseRequest, now int64) bool {
	for i, t := range takes {
		if req.Buckets[i].PeriodEndMs != leasePeriod(t.rule, now) {
			return true
		}
	}
	return false
}

// indexOf is the position of t's lease among takes, or -1.
func indexOf(takes []take, t take) int {
	for i, u := range takes {
		if u.rule == t.rule && u.id == t.id {
			return i
		}
	}
	return -1
}

// settleLeases records the answer a to lease call req (a nil: the call
// failed) in the leases of takes, and returns the records as written.
// costs[i] (none when costs is nil) is what the waiting request takes from
// take i's grant; the rest goes into the lease. claims[i] is the marker
// stamp take i's call claimed (0: none), which only this answer releases.
// A quota's grant is of the period its call carried (lease.Policy.Granted).
func (p *Plugin) settleLeases(takes []take, costs []float64, claims []int64, req *wire.LeaseRequest, a *wire.LeaseAnswer, now int64) []lease.Record {
	recs := make([]lease.Record, len(takes))
	for i, t := range takes {
		pol, claim, cost := t.rule.lease, claims[i], 0.0
		if costs != nil {
			cost = costs[i]
		}
		ch, _ := p.updateLease(t.id, now, func(r lease.Record) (lease.Record, bool) {
			switch {
			case a == nil:
				pol.Failed(&r, now, claim)
			case a.Granted:
				g := a.Buckets[i]
				r.Spent += cost
				pol.Granted(&r, now, req.Buckets[i].PeriodEndMs, max(g.Tokens-cost, 0), float64(g.Remaining), millis(g.ResetMs), claim)
			default:
				g := a.Buckets[i]
				pol.Refused(&r, now, req.Buckets[i].PeriodEndMs, float64(g.Remaining), millis(g.RetryAfterMs), millis(g.ResetMs), claim)
			}
			return r, true
		})
		recs[i] = ch.After
	}
	return recs
}

// readLeaseAnswer reads the answer to a lease call, or why it is unusable.
func readLeaseAnswer(req *wire.LeaseRequest, ans *Answer) (*wire.LeaseAnswer, string) {
	raw, why := answerBody(ans)
	if why != "" {
		return nil, why
	}
	a, err := wire.DecodeLeaseAnswer(raw, req)
	if err != nil {
		return nil, "malformed response body: " + err.Error()
	}
	return a, ""
}

// refill sends the refill a spend claimed (claim: the marker's stamp),
// owned by the plugin, not the request.
func (p *Plugin) refill(t take, rec lease.Record, claim int64) {
	p.held.add(t)
	req := &wire.LeaseRequest{Buckets: []wire.LeaseBucket{{
		Key: t.key, Rate: t.rule.limit.Rate, Burst: t.rule.limit.Burst, Want: t.rule.lease.Want(&rec, 0),
		Period: periodOf(t.rule, p.now())}}}
	p.detached([]take{t}, []int64{claim}, req)
}

// detached sends a refill or return call over takes (claims: their marker
// stamps) owned by the plugin, so its answer is recorded whatever becomes
// of the request that caused it. A detached call that fails only releases its claims: no request
// waited for it, and the next request that finds a lease short asks the
// service itself (a failed refill marking the lease down would let that
// key's requests pass unchecked under failure_mode allow, as when a flood
// of other keys slows the service).
func (p *Plugin) detached(takes []take, claims []int64, req *wire.LeaseRequest) {
	answer := func(ans *Answer) {
		a, why := readLeaseAnswer(req, ans)
		if why != "" {
			p.serviceFailed(takes, why)
			p.releaseLeases(takes, claims, p.now())
			return
		}
		p.settleLeases(takes, nil, claims, req, a, p.now())
	}
	err := p.leasePost(p.host, takes[0].rule.Service, req, answer)
	if err != nil {
		p.serviceFailed(takes, "dispatching a lease call: "+err.Error())
		p.releaseLeases(takes, claims, p.now())
	}
}

// releaseLeases releases the call markers claims of takes' leases.
func (p *Plugin) releaseLeases(takes []take, claims []int64, now int64) {
	for i, t := range takes {
		claim := claims[i]
		_, _ = p.updateLease(t.id, now, func(r lease.Record) (lease.Record, bool) {
			if claim == 0 || r.Pending != claim {
				return r, false
			}
			lease.Release(&r, claim)
			return r, true
		})
	}
}

// leasePost sends one lease call, counted, within lease_timeout_ms.
func (p *Plugin) leasePost(by caller, s *config.Service, req *wire.LeaseRequest, answer func(*Answer)) error {
	p.metrics.leaseCalls.Increment(1)
	return postWithin(by, s, s.LeasePath, wire.AppendLeaseRequest(make([]byte, 0, 160*len(req.Buckets)), req), s.LeaseTimeoutMS, answer)
}

// returnExpired hands back the tokens of this worker's expired leases and
// forgets the leases that are empty and expired. It runs on the tick and
// looks at returnScan leases at most, from where the last tick stopped;
// the returns go out in calls of at most wire.MaxBuckets leases. Each
// amount is what the winning write took out of its lease (lease.Policy
// Return), so a lease another worker spent from or returned meanwhile
// never sends more than it held.
func (p *Plugin) returnExpired() {
	now := p.now()
	h := &p.held
	var takes []take
	var claims []int64
	var req *wire.LeaseRequest
	flush := func() {
		if req != nil {
			p.detached(takes, claims, req)
			takes, claims, req = nil, nil, nil
		}
	}
	for range min(returnScan, len(h.list)) {
		if h.cursor >= len(h.list) {
			h.cursor = 0
		}
		hl := h.list[h.cursor]
		pol := hl.rule.lease
		period := periodOf(hl.rule, now)
		ch, err := p.updateLease(hl.id, now, func(r lease.Record) (lease.Record, bool) { return pol.Return(r, now, period.PeriodEndMs) })
		switch {
		case err != nil:
			h.cursor++
		case ch.Claimed() && ch.Before.Tokens > 0:
			h.cursor++
			if req == nil {
				req = &wire.LeaseRequest{}
			}
			takes = append(takes, take{rule: hl.rule, id: hl.id, key: hl.key})
			claims = append(claims, ch.After.Pending)
			req.Buckets = append(req.Buckets, wire.LeaseBucket{Key: hl.key, Rate: hl.rule.limit.Rate,
				Burst: hl.rule.limit.Burst, Return: min(ch.Before.Tokens, hl.rule.limit.Burst), Period: period})
			if len(req.Buckets) == wire.MaxBuckets {
				flush()
			}
		case lease.Free(&ch.After, now):
			h.remove(h.cursor) // the last one moves here: look at it next
		default:
			h.cursor++
		}
	}
	flush()
}

// leaseDecision is what the response headers report for a leased rule:
// remaining, the whole tokens this Envoy could count on at the last answer
// (its lease after this request plus what the global bucket then held, at
// most the burst); reset, the wait the last answer gave for the global
// bucket to be full, less the time since, and never more than a bucket in
// full debt needs (a stamp from before a backward clock step).
func leaseDecision(ru *rule, r *lease.Record, now int64) bucket.Decision {
	longest := int64(min(2*ru.limit.Burst/ru.limit.Rate*1e9, float64(bucket.Never)))
	return bucket.Decision{
		Allowed:    true,
		Remaining:  int64(min(r.Tokens+r.Remaining, ru.limit.Burst)),
		ResetAfter: time.Duration(max(min(r.ResetAt-now, longest), 0)),
	}
}
