package engine

import (
	"strconv"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/engine/lease"
	"github.com/ratelimit-wasm/tokenbucket/engine/store"
)

// decideShadows runs each local shadow rule's bucket on its own: it consumes
// as an enforced rule would, counts what it would reject, and never rejects.
func (c *Request) decideShadows() {
	for i := range c.plan.shadowLocal {
		t := &c.plan.shadowLocal[i]
		ok, out, err := c.decide(c.plan.now, c.plan.shadowLocal[i:i+1])
		switch {
		case err != nil:
			t.rule.failedOpen.Increment(1)
		case ok:
			t.held = true
			t.rule.allowed.Increment(1)
			if t.rule.slots {
				t.rule.inFlight.Add(1)
			}
			if out[0].Wait > 0 {
				// Never held: the rule counts what it would have.
				t.rule.shadowDelayed.Increment(1)
			}
		default:
			c.plugin.shadowRejected(t.rule)
		}
	}
}

// enforceLocal decides the enforced local rules as one atomic stack. On a
// shared-data error it fails open: nothing was consumed, the rules count it.
func (c *Request) enforceLocal() *rejection {
	pl := &c.plan
	if len(pl.local) == 0 {
		return nil
	}
	p := c.plugin
	ok, out, err := c.decide(pl.now, pl.local)
	if err != nil {
		for _, t := range pl.local {
			t.rule.failedOpen.Increment(1)
		}
		p.warn(&p.failLog, "failing open (counted in rule.<name>.failed_open): "+err.Error())
		return nil
	}
	if !ok {
		return rejecting(pl.local, out)
	}
	for i := range pl.local {
		t := &pl.local[i]
		t.held, t.d = true, out[i]
		t.rule.allowed.Increment(1)
		if t.rule.slots {
			t.rule.inFlight.Add(1)
			out[i] = slotDecision(out[i])
		}
		c.show(t.rule, out[i])
		if w := out[i].Wait; w > 0 {
			c.goesAt = max(c.goesAt, pl.now+int64(w))
		}
	}
	return nil
}

// decide takes every take's cost from its bucket in shared data, all or
// nothing; out (the request's scratch) holds the decisions until the next
// call.
func (c *Request) decide(now int64, takes []take) (ok bool, out []bucket.Decision, err error) {
	p, s := c.plugin, &c.scratch
	s.reqs = s.reqs[:0]
	for _, t := range takes {
		s.reqs = append(s.reqs, store.Request{ID: t.id, Limit: t.rule.limitAt(now), Cost: t.cost, MaxWait: time.Duration(t.maxWait)})
	}
	out = s.decisions(len(takes))
	ok, o, err := p.table.Decide(now, s.reqs, out)
	p.count(o)
	return ok, out, err
}

// giveBack gives back everything the request took and still holds: its
// spends from leases, its local rules' tokens (a later check rejected it)
// and its slots, through giveBackSlot as at Done (owed when shared data
// refuses the write). It is called only by end, so each token is given
// back at most once; the held flags it clears are the record of what was
// taken.
func (c *Request) giveBack() {
	pl := &c.plan
	p := c.plugin
	now := p.now()
	spends := c.scratch.spends[:0]
	for i := range pl.leased {
		if t := &pl.leased[i]; t.held {
			t.held = false
			spends = append(spends, lease.Spend{ID: t.id, Cost: t.cost, Period: t.period})
		}
	}
	c.scratch.spends = spends
	if len(spends) > 0 {
		p.leases.Refund(now, spends)
	}
	reqs := c.scratch.reqs[:0]
	for i := range pl.local {
		if t := &pl.local[i]; t.held && !t.rule.slots {
			t.held = false
			// A take still waiting gives back only what no later holder
			// counts on (bucket.Limit.Cancel).
			reqs = append(reqs, store.Request{ID: t.id, Limit: t.rule.limitAt(now), Cost: t.cost, GoesAt: pl.now + int64(t.d.Wait)})
		}
	}
	c.scratch.reqs = reqs
	if len(reqs) > 0 {
		p.metrics.refunds.Increment(uint64(p.table.Refund(now, reqs)))
	}
	for i := range pl.local {
		if t := &pl.local[i]; t.held { // a slot, after the tokens: its line wakes to them
			c.giveBackSlot(t) // owed if it cannot be written (concurrency.go)
			p.metrics.refunds.Increment(1)
		}
	}
	c.giveBackCluster()
	c.releaseClusterSlots()
}

// giveBackCluster refunds the per-request cluster takes the request holds
// with one charge call of −cost each (a held request that ended leaves its
// cluster takes spent instead: abandon, delay.go).
// The limit service recorded them as this caller's reservations (a request
// with a max_delay_ms, or a refundable rule), which is what lets it give
// them back; takes it did not record hold nothing to refund.
func (c *Request) giveBackCluster() {
	var takes []*take
	recorded := false
	for i := range c.plan.cluster {
		t := &c.plan.cluster[i]
		recorded = recorded || t.maxWait > 0
	}
	for i := range c.plan.cluster {
		if t := &c.plan.cluster[i]; t.held && (recorded || t.rule.charges) {
			t.held, t.amount = false, -t.cost
			takes = append(takes, t)
		}
	}
	if len(takes) > 0 {
		c.plugin.metrics.refunds.Increment(uint64(len(takes)))
		c.chargeCluster(takes)
	}
}

// rejecting is the rejection by the first take whose decision refused; nil
// when none did.
func rejecting(takes []take, out []bucket.Decision) *rejection {
	for i, t := range takes {
		switch {
		case out[i].Allowed:
		case t.rule.slots:
			return &rejection{rule: t.rule, reason: reasonConcurrency, d: slotDecision(out[i])}
		default:
			return &rejection{rule: t.rule, reason: reasonExceeded, d: out[i], full: t.full}
		}
	}
	return nil
}

// show makes ru's decision the one the response headers report if ru is the
// closest to its limit so far (the smallest fraction of its burst left).
func (c *Request) show(ru *rule, d bucket.Decision) {
	f := float64(d.Remaining) / ru.limit.Burst
	if c.shown == nil || f < c.shownLeft {
		c.shown, c.decision, c.shownLeft = ru, d, f
	}
}

// shadowRejected counts a shadow rule's would-be rejection and logs it at
// most once a second per rule.
func (p *Plugin) shadowRejected(ru *rule) {
	ru.shadowRej.Increment(1)
	if n, ok := ru.shadowLog.allow(p.now()); ok {
		p.host.Log(LogInfo, Name+": shadow rule "+strconv.Quote(ru.Name)+" would have rejected a request ("+strconv.Itoa(n)+" similar lines suppressed)")
	}
}

// limitAt returns the bucket.Limit of ru's decisions at now (Unix ns): a
// token bucket's is always the same; a quota's is its limit over the
// calendar period that holds now (bucket.Limit's PeriodStart and
// PeriodEnd), so its bucket is full again at each boundary. The rule keeps
// the current period's Limit and RateLimit-Policy (w, the period's length,
// varies with months and daylight-saving changes) and computes them again
// only when now leaves that period: once a period, not once a request. A
// rule belongs to one Plugin, which one thread runs. It lives here, on the
// request path's files, so a token bucket's request reads no other file.
func (ru *rule) limitAt(now int64) bucket.Limit {
	l := &ru.limit
	// A token bucket's PeriodEnd is 0; a quota's is set from compile on.
	if l.PeriodEnd == 0 || (now >= l.PeriodStart && now < l.PeriodEnd) {
		return *l
	}
	start, end := ru.Limit.Calendar.Window(time.Unix(0, now))
	l.PeriodStart, l.PeriodEnd = start.UnixNano(), end.UnixNano()
	ru.policy = ru.quotedName + ";q=" + ru.burst + ";w=" + strconv.FormatInt(int64(end.Sub(start)/time.Second), 10)
	return *l
}
