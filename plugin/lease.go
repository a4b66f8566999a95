package plugin

import (
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/lease"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// Cluster rules with "sync": "lease" (see package lease for the model).
//
// A request spends from its rules' leases in shared data, all or none, with
// no callout. A spend that leaves a lease below half its size claims the
// lease's refill, sent detached (the plugin context owns the call), never
// holding a request. A request that finds a lease short waits for one lease
// call over all its leased rules (min: its costs; want: the leases' sizes),
// unless the global bucket refused lately (it is rejected at once, with the
// wait the service reported) or the service failed lately (failure_mode
// applies at once). Every worker remembers the leases it called for, and on
// each tick hands back the tokens of those that expired.

// maxHeld bounds the leases one worker remembers for returns; beyond it a
// lease's expired tokens go back only through a worker that holds it, or
// are lost to this Envoy when its slot is reused (under-admission).
const maxHeld = 4096

// held is a lease this worker called for: what a return call needs.
type held struct {
	rule *rule
	key  string
}

// leasePolicy is a rule's lease tuning (compile keeps it on the rule).
func leasePolicy(cr *config.Rule) lease.Policy {
	return lease.Policy{
		TTL:   time.Duration(cr.Lease.TTLMS) * time.Millisecond,
		Cap:   cr.Lease.MaxShare * cr.Limit.Burst,
		Stale: time.Duration(cr.Service.TimeoutMS)*time.Millisecond + time.Second,
	}
}

// spendLeases spends the request's leased takes. It returns a rejection,
// or paused when the request waits for a lease call.
func (c *httpContext) spendLeases() (rej *rejection, paused bool) {
	p, pl := c.plugin, &c.plan
	n := len(pl.leased)
	pl.spends = pl.spends[:0]
	for _, t := range pl.leased {
		pl.spends = append(pl.spends, lease.Spend{ID: t.id, Cost: t.cost, Stale: int64(t.rule.lease.Stale)})
	}
	if cap(p.results) < n {
		p.results = make([]lease.Result, n)
	}
	out := p.results[:n]
	ok, err := p.leases.Spend(pl.now, pl.spends, out)
	if err != nil {
		for _, t := range pl.leased {
			t.rule.failedOpen.Increment(1)
		}
		p.warn(&p.failLog, "failing open (counted in rule.<name>.failed_open): "+err.Error())
		return nil, false
	}
	for i, r := range out {
		if r.Refill {
			p.refill(pl.leased[i], r.Record, c.id)
		}
	}
	if ok {
		pl.leaseSpent = true
		for i := range pl.leased {
			t := &pl.leased[i]
			t.held, t.d = true, leaseDecision(t.rule, &out[i].Record, pl.now)
			t.rule.allowed.Increment(1)
			c.show(t.rule, t.d)
		}
		return nil, false
	}
	// A lease is short. Recent answers may settle the request at once.
	for i, r := range out {
		t, rec := pl.leased[i], &out[i].Record
		switch {
		case !r.Lacked:
		case rec.DownUntil > pl.now:
			return c.leaseServiceDown(t.rule), false
		case rec.AskAt > pl.now:
			c.refundTaken() // the local rules' tokens
			return &rejection{rule: t.rule, reason: reasonExceeded, id: t.id, d: bucket.Decision{
				RetryAfter: time.Duration(max(rec.RetryAt-pl.now, int64(time.Millisecond))), ResetAfter: time.Duration(max(rec.ResetAt-pl.now, 0))}}, false
		}
	}
	var short []take
	for i, r := range out {
		if r.Lacked {
			short = append(short, pl.leased[i])
		}
	}
	if err := c.leaseCall(short); err != nil {
		p.serviceFailed(short, "dispatching the lease call: "+err.Error())
		return c.leaseServiceDown(short[0].rule), false
	}
	return nil, true
}

// leaseServiceDown applies failure_mode for a request whose lease is short
// while the service is failing: deny rejects it, allow lets it through
// (counted as failed open).
func (c *httpContext) leaseServiceDown(ru *rule) *rejection {
	if ru.Service.FailureMode == config.FailDeny {
		c.refundTaken()
		return &rejection{rule: ru, reason: reasonServiceDown}
	}
	for _, t := range c.plan.leased {
		t.rule.failedOpen.Increment(1)
	}
	return nil
}

// leaseCall sends the lease call a short request waits for, over its short
// leases: its cost from each at least, and each lease's size for the leases
// whose refill it could claim.
func (c *httpContext) leaseCall(short []take) error {
	p, now := c.plugin, c.plan.now
	req := &wire.LeaseRequest{HashTag: p.hashTag, Buckets: make([]wire.LeaseBucket, len(short))}
	claimed := make([]bool, len(short))
	for i, t := range short {
		want := t.cost
		rec, _ := p.leases.Update(t.id, now, func(r *lease.Record) bool {
			if t.rule.lease.InFlight(r, now) {
				return false
			}
			r.Pending, claimed[i] = max(now, 1), true
			return true
		})
		if claimed[i] {
			want = t.rule.lease.Want(&rec, t.cost)
		}
		req.Buckets[i] = wire.LeaseBucket{Key: t.key, Rate: t.rule.limit.Rate, Burst: t.rule.limit.Burst, Want: want, Min: t.cost}
		p.hold(t)
	}
	err := p.leasePost(short[0].rule.Service, req, func(numHeaders, bodySize, _ int) {
		c.onLeaseAnswer(short, req, claimed, numHeaders, bodySize)
	})
	if err != nil {
		p.settleLeases(short, claimed, nil, now)
	}
	return err
}

// onLeaseAnswer resumes or rejects the request that waited for a lease call
// over its short leases: granted, the request takes its costs from the
// grants (the rest goes to the leases) and from its other leases, all or
// none.
func (c *httpContext) onLeaseAnswer(short []take, req *wire.LeaseRequest, claimed []bool, numHeaders, bodySize int) {
	p, pl := c.plugin, &c.plan
	now := p.now()
	a, why := readLeaseAnswer(req, numHeaders, bodySize)
	recs := p.settleLeases(short, claimed, a, now)
	switch {
	case why != "":
		p.serviceFailed(short, why)
		if rej := c.leaseServiceDown(short[0].rule); rej != nil {
			c.rejectPaused(*rej)
			return
		}
		c.afterLeases()
		return
	case !a.Granted:
		for i, g := range a.Buckets {
			if g.RetryAfterMs > 0 || i == len(a.Buckets)-1 {
				c.refundTaken()
				t := short[i]
				c.rejectPaused(rejection{rule: t.rule, reason: reasonExceeded, id: t.id, d: bucket.Decision{
					Remaining: g.Remaining, RetryAfter: max(millis(g.RetryAfterMs), time.Millisecond), ResetAfter: millis(g.ResetMs)}})
				return
			}
		}
	}
	// The other leases had the tokens when the request looked; spend them
	// now. If another request spent them meanwhile, the grants' costs go to
	// the leases and the request is refused (under-admission, never over).
	pl.spends = pl.spends[:0]
	for _, t := range pl.leased {
		if indexOf(short, t) < 0 {
			pl.spends = append(pl.spends, lease.Spend{ID: t.id, Cost: t.cost, Stale: int64(t.rule.lease.Stale)})
		}
	}
	n := len(pl.spends)
	if cap(p.results) < n {
		p.results = make([]lease.Result, n)
	}
	ok, err := p.leases.Spend(now, pl.spends, p.results[:n])
	for _, t := range short {
		pl.spends = append(pl.spends, lease.Spend{ID: t.id, Cost: t.cost})
	}
	if err != nil || !ok {
		p.leases.Refund(now, pl.spends[n:])
		c.refundTaken()
		t := short[0]
		c.rejectPaused(rejection{rule: t.rule, reason: reasonExceeded, id: t.id, d: bucket.Decision{RetryAfter: time.Millisecond}})
		return
	}
	pl.leaseSpent = true
	k := 0 // the next of the other leases' results
	for i := range pl.leased {
		t := &pl.leased[i]
		t.rule.allowed.Increment(1)
		t.held = true
		if j := indexOf(short, *t); j >= 0 {
			t.d = leaseDecision(t.rule, &recs[j], now)
		} else {
			r := &p.results[k]
			if r.Refill {
				p.refill(*t, r.Record, c.id)
			}
			t.d = leaseDecision(t.rule, &r.Record, now)
			k++
		}
		c.show(t.rule, t.d)
	}
	c.afterLeases()
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

// afterLeases goes on with a request whose leases are settled: the
// per-request cluster rules, if any, else the request continues.
func (c *httpContext) afterLeases() {
	if len(c.plan.cluster) > 0 {
		if c.dispatch() == types.ActionContinue {
			resume(c.plugin)
		}
		return
	}
	resume(c.plugin)
}

// settleLeases records a lease call's answer (nil: the call failed) in the
// leases of takes, and returns the records as written. A granted bucket's
// tokens beyond the waiting request's cost go into the lease (none for a
// refill or return call: cost 0 there).
func (p *pluginContext) settleLeases(takes []take, claimed []bool, a *wire.LeaseAnswer, now int64) []lease.Record {
	recs := make([]lease.Record, len(takes))
	for i, t := range takes {
		pol := t.rule.lease
		recs[i], _ = p.leases.Update(t.id, now, func(r *lease.Record) bool {
			switch {
			case a == nil:
				pol.Failed(r, now, claimed[i])
			case a.Granted:
				g := a.Buckets[i]
				r.Spent += t.cost
				pol.Granted(r, now, max(g.Tokens-t.cost, 0), float64(g.Remaining), millis(g.ResetMs), claimed[i])
			default:
				g := a.Buckets[i]
				pol.Refused(r, now, float64(g.Remaining), millis(g.RetryAfterMs), millis(g.ResetMs), claimed[i])
			}
			return true
		})
	}
	return recs
}

// readLeaseAnswer reads the answer to a lease call, or why it is unusable.
func readLeaseAnswer(req *wire.LeaseRequest, numHeaders, bodySize int) (*wire.LeaseAnswer, string) {
	raw, why := answerBody(numHeaders, bodySize)
	if why != "" {
		return nil, why
	}
	a, err := wire.DecodeLeaseAnswer(raw, req)
	if err != nil {
		return nil, "malformed response body: " + err.Error()
	}
	return a, ""
}

// refill sends the refill a spend claimed, detached from the request.
func (p *pluginContext) refill(t take, rec lease.Record, from uint32) {
	t.cost = 0 // nothing of it goes to a request
	p.hold(t)
	req := &wire.LeaseRequest{HashTag: p.hashTag, Buckets: []wire.LeaseBucket{{
		Key: t.key, Rate: t.rule.limit.Rate, Burst: t.rule.limit.Burst, Want: t.rule.lease.Want(&rec, 0)}}}
	p.detached(t, req, from)
}

// detached sends a refill or return call owned by the plugin context, so
// its answer is recorded whatever becomes of the request that caused it;
// from is the context the callback runs in.
func (p *pluginContext) detached(t take, req *wire.LeaseRequest, from uint32) {
	takes, claimed := []take{t}, []bool{true}
	answer := func(numHeaders, bodySize, _ int) {
		a, why := readLeaseAnswer(req, numHeaders, bodySize)
		if why != "" {
			p.serviceFailed(takes, why)
		}
		p.settleLeases(takes, claimed, a, p.now())
	}
	err := p.asPlugin(from, func() error { return p.leasePost(t.rule.Service, req, answer) })
	if err != nil {
		p.serviceFailed(takes, "dispatching a lease call: "+err.Error())
		p.settleLeases(takes, claimed, nil, p.now())
	}
}

// leasePost sends one lease call, counted.
func (p *pluginContext) leasePost(s *config.Service, req *wire.LeaseRequest, answer func(int, int, int)) error {
	p.metrics.leaseCalls.Increment(1)
	return post(s, s.LeasePath, wire.AppendLeaseRequest(make([]byte, 0, 160*len(req.Buckets)), req), answer)
}

// hold remembers t's lease for returns.
func (p *pluginContext) hold(t take) {
	if _, ok := p.held[t.id]; ok || len(p.held) >= maxHeld {
		return
	}
	p.held[t.id] = held{rule: t.rule, key: t.key}
}

// returnExpired hands back the tokens of this worker's expired leases, and
// forgets the leases that are empty and expired. It runs on the tick.
func (p *pluginContext) returnExpired() {
	now := p.now()
	for id, h := range p.held {
		var back float64
		rec, err := p.leases.Update(id, now, func(r *lease.Record) bool {
			if !h.rule.lease.Expired(r, now) {
				return false
			}
			back, r.Tokens, r.Pending = r.Tokens, 0, max(now, 1)
			return true
		})
		switch {
		case err != nil:
			continue
		case back > 0:
			p.detached(take{rule: h.rule, id: id, key: h.key}, &wire.LeaseRequest{HashTag: p.hashTag, Buckets: []wire.LeaseBucket{{
				Key: h.key, Rate: h.rule.limit.Rate, Burst: h.rule.limit.Burst, Return: min(back, h.rule.limit.Burst)}}}, p.id)
		case lease.Free(&rec, now):
			delete(p.held, id)
		}
	}
}

// leaseDecision is what the response headers report for a leased rule:
// remaining, the whole tokens this Envoy could count on at the last answer
// (its lease after this request plus what the global bucket then held, at
// most the burst); reset, the wait the last answer gave for the global
// bucket to be full, less the time since.
func leaseDecision(ru *rule, r *lease.Record, now int64) bucket.Decision {
	return bucket.Decision{
		Allowed:    true,
		Remaining:  int64(min(r.Tokens+r.Remaining, ru.limit.Burst)),
		ResetAfter: time.Duration(max(r.ResetAt-now, 0)),
	}
}

// asPlugin runs f with the plugin context as the host's effective context,
// so the calls f dispatches belong to it, then returns to context from (the
// callback's own).
func (p *pluginContext) asPlugin(from uint32, f func() error) error {
	if from == p.id {
		return f()
	}
	if err := proxywasm.SetEffectiveContext(p.id); err != nil {
		return err
	}
	err := f()
	if err := proxywasm.SetEffectiveContext(from); err != nil {
		p.warn(&p.serviceLog, "back to the request's context: "+err.Error())
	}
	return err
}
