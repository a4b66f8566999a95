package engine

import (
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
)

// Holding a request on its leases (a leased rule with max_delay_ms). A
// lease's tokens never go into debt: a request takes nothing from a lease
// while it waits, so the fleet's bound stays the global bucket's, burst +
// rate × t, and a held request that ends has nothing to give back to it.
//
// A request that a leased rule would refuse for want of tokens (the global
// bucket refused the lease call, or refused lately: lease.Policy Refusing;
// or other requests took the grant first) is held instead, when its turn
// comes within the rule's bound: its turn is the refusal's retry moment
// (when the global bucket will hold its cost), and never before the turn
// after the last request held on the same lease in this worker, which is
// that one's turn plus the time the rate takes to refill its cost
// (Plugin.leaseLine). At its turn the request spends from its leases as a
// new request would (a lease call when they are short), without queueing
// again; refused again, it is held until the new retry moment while that
// is within the bound. A
// request arriving while others wait on its lease queues behind them, so
// requests go on in the order they came, one worker at a time. A turn past
// the bound, or a rule holding max_waiting requests already, refuses the
// request at once with the Retry-After it gets without holding.
//
// A request held on its leases that ends (the client went away, Envoy
// answered it) frees its place: when it was the last in line, the line
// moves back to its turn. It gives back the local rules' tokens it
// reserved (giveBack), and took nothing from its leases.

// leaseNow is the moment a lease step of the request runs: its decision's
// time, or the clock's once its turn came after a hold.
func (c *Request) leaseNow() int64 {
	if c.leaseTurn {
		return c.plugin.now()
	}
	return c.plan.now
}

// costTime is how long the rate takes to refill t's cost, in ns.
func costTime(t *take) int64 {
	return int64(min(t.cost/t.rule.limit.Rate*1e9, 1e18))
}

// queueOnLeases holds a request that finds others held on its leases in
// this worker behind them, when its turn is within the bound; a request
// whose turn is past the bound, or whose rule holds max_waiting requests
// already, is refused at once (it never spends ahead of the requests
// held before it), with the wait until its turn. It reports whether it
// held the request, or the refusal.
func (c *Request) queueOnLeases(now int64) (bool, *rejection) {
	if c.leaseTurn {
		return false, nil
	}
	var at int64
	var by *take
	for i := range c.plan.leased {
		t := &c.plan.leased[i]
		if line := c.plugin.leaseLine[t.id]; t.rule.maxWait > 0 && line > max(at, now) {
			at, by = line, t
		}
	}
	if by == nil {
		return false, nil
	}
	if by.full || at-c.plan.now > by.maxWait {
		return false, &rejection{rule: by.rule, reason: reasonExceeded, full: by.full,
			d: bucket.Decision{RetryAfter: time.Duration(at - now), ResetAfter: time.Duration(at - now)}}
	}
	return c.holdOnLeases(at, now), nil
}

// orHoldOnLeases holds a request that rej, a leased rule's refusal for want
// of tokens, would refuse, when its turn is within the rule's bound; it
// reports whether it did. Otherwise rej stands (marked full when the rule
// holds max_waiting requests already).
func (c *Request) orHoldOnLeases(rej *rejection, now int64) bool {
	if rej == nil || rej.reason != reasonExceeded || rej.rule.maxWait == 0 {
		return false
	}
	var t *take
	for i := range c.plan.leased {
		if c.plan.leased[i].rule == rej.rule {
			t = &c.plan.leased[i]
		}
	}
	if t == nil {
		return false
	}
	if t.full {
		rej.full = true
		return false
	}
	at := now + max(int64(rej.d.RetryAfter), int64(time.Millisecond))
	if !c.leaseTurn {
		at = max(at, c.plugin.leaseLine[t.id])
	}
	if at-c.plan.now > t.maxWait {
		return false
	}
	return c.holdOnLeases(at, now)
}

// holdOnLeases holds the request until at, when it spends from its leases
// again; it reports false when the host has no timer (the request is
// refused as it would be without holding).
func (c *Request) holdOnLeases(at, now int64) bool {
	p := c.plugin
	gen := c.gen
	c.leaseAt, c.leaseHolding = at, true
	c.countLeaseWaiting(1)
	err := c.stream.After(at-now, func() {
		if c.gen == gen && c.leaseHolding {
			c.leaseHolding = false
			c.countLeaseWaiting(-1)
			c.leaseTurn = true
			c.step = stepLeases
			c.next(nil)
		}
	})
	if err != nil {
		c.leaseHolding = false
		c.countLeaseWaiting(-1)
		p.warn(&p.failLog, "holding a request on its lease: "+err.Error()+"; it is refused as without holding")
		return false
	}
	c.leaseHeld = true
	if p.leaseLine == nil {
		p.leaseLine = map[uint64]int64{}
	}
	for i := range c.plan.leased {
		if t := &c.plan.leased[i]; t.maxWait > 0 {
			p.leaseLine[t.id] = max(p.leaseLine[t.id], at+costTime(t))
		}
	}
	return true
}

// countLeaseWaiting adds n to the held requests of the leased rules that
// may hold this one.
func (c *Request) countLeaseWaiting(n int) {
	for i := range c.plan.leased {
		if t := &c.plan.leased[i]; t.maxWait > 0 {
			t.rule.waiting += n
			t.rule.waitingGauge.Add(int64(n))
		}
	}
}

// leaseWentOn counts the hold on its leases of a request that spent from
// them at now, and records how long it was held.
func (c *Request) leaseWentOn(now int64) {
	c.heldFor = max(now-c.plan.now, 1)
	for i := range c.plan.leased {
		if t := &c.plan.leased[i]; t.maxWait > 0 {
			t.rule.delayed.Increment(1)
			t.rule.delayMs.Increment(uint64((c.heldFor + 999_999) / 1e6))
		}
	}
}

// abandonLeaseHold ends the hold on its leases of a request that will not
// go on: it frees its place (the line moves back when it was the last),
// and gives back what its local rules reserved; it took nothing from its
// leases.
func (c *Request) abandonLeaseHold() {
	p := c.plugin
	c.leaseHolding = false
	c.countLeaseWaiting(-1)
	for i := range c.plan.leased {
		if t := &c.plan.leased[i]; t.maxWait > 0 {
			t.rule.delayAbandon.Increment(1)
			if p.leaseLine[t.id] == c.leaseAt+costTime(t) {
				p.leaseLine[t.id] = c.leaseAt
			}
		}
	}
	c.giveBack()
}

// dropPassedTurns forgets the lines whose last turn has passed (the tick),
// so the map holds only leases with requests held on them lately.
func (p *Plugin) dropPassedTurns() {
	now := p.now()
	for id, at := range p.leaseLine {
		if at <= now {
			delete(p.leaseLine, id)
		}
	}
}
