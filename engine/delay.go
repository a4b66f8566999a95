package engine

import (
	"strconv"
	"time"
)

// Holding a request until its tokens are there (algorithm_config
// max_delay_ms). A rule that holds lets its takes reserve (bucket.Limit
// Reserve, through store.Request.MaxWait and the decide call's
// max_delay_ms): a request short of tokens takes them now, into debt, and
// its decision's Wait is when they would have been there. The request's
// moment to go on (goesAt) is the latest of its takes' (stacked rules: the
// longest wait, all taken in the one atomic decision or none). end holds it
// instead of going on: the host's timer (Stream.After) calls goOn, which
// resumes it. A held request that ends first (the client went away, Envoy
// answered it: Done, OnResponseHeaders) is abandoned: the one refund,
// giveBack, returns what it took of local rules, once (its held flags), by
// bucket.Limit.Cancel for a take still waiting; its cluster takes stay
// spent (abandon), so over every interval the requests going on stay
// within burst + rate × t. Shadow rules reserve too and
// count what they would have held (shadow_delayed), never holding.
//
// Bounded: each rule holds at most max_waiting requests at once in one
// Plugin (waiting). The place is claimed when the request is decided with
// a wait (planRules: rule.claimed), before any call it makes, and kept
// until it goes on, is refused or ends (releaseClaims), so requests decided
// while others wait for an answer count them too; with every place claimed
// a take may not wait, so a request short of tokens is refused at once
// (waiting_full).

// DelayHeader is the response header of a request the engine held: how
// long, in whole milliseconds (rounded up), from its decision to the moment
// it went on.
const DelayHeader = "x-ratelimit-delayed-ms"

// hold holds the request until goesAt; it reports false when the request
// goes on at once (the moment has passed, or the host has no timer: the
// request fails open, counted).
func (c *Request) hold() bool {
	p := c.plugin
	now := p.now()
	if c.goesAt <= now {
		c.wentOn(now)
		return false
	}
	gen := c.gen
	c.holding = true
	c.countWaiting(1)
	c.releaseClaims(true)
	err := c.stream.After(c.goesAt-now, func() {
		if c.gen == gen && c.holding {
			c.goOn()
		}
	})
	if err != nil {
		c.holding = false
		c.countWaiting(-1)
		c.eachWaiting(func(t *take) { t.rule.failedOpen.Increment(1) })
		p.warn(&p.failLog, "holding a request until its tokens are there (counted in rule.<name>.failed_open): "+err.Error()+"; it goes on at once")
		c.wentOn(now)
		return false
	}
	return true
}

// goOn is the end of the hold: the request goes on, its RateLimit headers
// as they stand now.
func (c *Request) goOn() {
	c.holding = false
	c.countWaiting(-1)
	c.releaseClaims(false)
	c.wentOn(c.plugin.now())
	c.resume()
}

// wentOn records the hold that ended at now and counts it for the rules
// that held the request; the shown decision's reset is the time left from
// now.
func (c *Request) wentOn(now int64) {
	c.heldFor = max(now-c.plan.now, 1)
	c.decision.ResetAfter = max(c.decision.ResetAfter-time.Duration(c.heldFor), 0)
	c.goesAt = 0
	c.eachWaiting(func(t *take) {
		t.rule.delayed.Increment(1)
		t.rule.delayMs.Increment(uint64((c.heldFor + 999_999) / 1e6))
	})
}

// abandon ends the hold of a request that will not go on: what it took of
// local rules comes back (giveBack, once: bucket.Limit.Cancel keeps the
// moments of the holders behind it), and the rules count it. What it took
// of the limit service's buckets stays spent: the service cannot tell
// whether others reserved behind it (other workers and Envoys reserve in
// the same bucket), and a refund while they wait would let a new request go
// on beside them, over the rate.
func (c *Request) abandon() {
	c.holding = false
	c.countWaiting(-1)
	c.releaseClaims(false)
	c.eachWaiting(func(t *take) { t.rule.delayAbandon.Increment(1) })
	for i := range c.plan.cluster {
		c.plan.cluster[i].held = false // spent, as if it had gone on
	}
	c.giveBack()
}

// eachWaiting calls f with each held take whose rule holds the request (a
// wait of its own).
func (c *Request) eachWaiting(f func(*take)) {
	for _, takes := range [...][]take{c.plan.local, c.plan.cluster, c.plan.leased} {
		for i := range takes {
			if t := &takes[i]; t.d.Wait > 0 && t.rule.maxWait > 0 {
				f(t)
			}
		}
	}
}

// releaseClaims gives back the places of max_waiting the request's takes
// claimed (planRules); with held, it keeps those of the takes that hold
// the request (eachWaiting), given back when the hold ends.
func (c *Request) releaseClaims(held bool) {
	for _, takes := range [...][]take{c.plan.local, c.plan.cluster, c.plan.leased, c.plan.slotsC} {
		for i := range takes {
			t := &takes[i]
			if t.claim && !(held && t.d.Wait > 0) {
				t.claim = false
				t.rule.claimed--
			}
		}
	}
}

// countWaiting adds n to the held requests of the rules that hold this one.
func (c *Request) countWaiting(n int) {
	c.eachWaiting(func(t *take) {
		t.rule.waiting += n
		t.rule.waitingGauge.Add(int64(n))
	})
}

// countDelayRefusal counts a refusal by a rule that holds requests: its
// wait would pass max_delay_ms, or it held max_waiting already.
func (c *Request) countDelayRefusal(rej *rejection) {
	ru := rej.rule
	if rej.reason != reasonExceeded || ru.maxWait == 0 || ru.delayRefused == nil {
		return
	}
	if rej.full {
		ru.waitingFull.Increment(1)
		return
	}
	ru.delayRefused.Increment(1)
}

// delayHeader adds DelayHeader to a response of a request that was held.
func (c *Request) delayHeader(add func(name, value string)) {
	b := strconv.AppendInt(c.scratch.text[:0], (c.heldFor+999_999)/1e6, 10)
	c.scratch.text = b
	add(DelayHeader, aliasString(b))
}
