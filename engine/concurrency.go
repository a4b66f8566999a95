package engine

import (
	"strconv"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/engine/store"
)

// Concurrency rules (algorithm "concurrency"): at most max_in_flight
// requests of one key in flight at once in this Envoy.
//
// Model: a key's slots are a bucket in the same shared-data table as the
// token buckets, one that never refills (bucket.Limit{Rate: 0, Burst:
// max_in_flight}); a request takes one slot (cost 1) when it is admitted,
// in the one atomic decision of the enforced local rules (local.go), so
// slots stack with token buckets all or none. A slot is the take's held
// flag, as for a token: a later refusal gives it back with the rest
// (giveBack), and Done, the one place where every request ends whatever
// ended it (the response, a reset of either side, a timeout, a later
// filter's reply, a drain), gives back what is still held (releaseSlots).
// Both go through giveBackSlot, which clears the flag, so a slot comes
// back exactly once, and owes a release shared data refuses (releaseSlot),
// so no path loses one. A request admitted
// under an earlier configuration gives back to the table it took from: its
// takes keep their rule and identity, and an identity holds the rule's
// max_in_flight (keyIdentities), so a reload that changes the limit starts
// a new table rather than mixing two. A key with nothing in flight is a
// full bucket, which the table reclaims like any full bucket (max_keys);
// an entry with slots out is evicted only when its whole group is busy,
// and an eviction can admit at most max_in_flight more for that key.
//
// Shadow rules take slots of their own (the rule's identity is its own,
// so they block nothing), count the requests they would refuse, and give
// their slots back at Done as well.
//
// Answers: a refusal says concurrency_limit_exceeded, with a Retry-After
// of 1 or 2 seconds (the time a slot frees is not known: 1 s and a jitter
// that is the same for the same client); the RateLimit headers report q =
// max_in_flight, r = the free slots, and t = 0 on an admission (a slot is
// free now) or 1 on a refusal (the Retry-After's base). The rule's
// in_flight gauge counts the slots its requests hold.

// reasonConcurrency is the reason of a refusal by a concurrency rule.
const reasonConcurrency = "concurrency_limit_exceeded"

// slotRetry is the base of a concurrency refusal's Retry-After, and its
// RateLimit t: a slot frees when some request ends, which no one knows.
const slotRetry = time.Second

// slotDecision is d as a concurrency rule reports it: nothing refills, so
// an admission's reset is 0 (a slot is free, or was) and a refusal's retry
// is slotRetry, not bucket.Never.
func slotDecision(d bucket.Decision) bucket.Decision {
	d.ResetAfter = 0
	if !d.Allowed {
		d.RetryAfter = slotRetry
	}
	return d
}

// slotRetryAfter is the Retry-After of a concurrency refusal: 1 s plus a
// second for half the clients, the same for the same client (key:
// jitterKey), so clients refused together do not all come back at once.
func slotRetryAfter(key uint64) int64 {
	return int64(slotRetry/time.Second) + int64(mix(key^0x5851f42d4c957f2d)>>63)
}

// tookSlots counts the slots the held takes of concurrency rules hold.
func tookSlots(takes []take) {
	for i := range takes {
		if t := &takes[i]; t.held && t.rule.slots {
			t.rule.inFlight.Add(1)
		}
	}
}

// releaseSlots gives back the slots the request still holds, enforced and
// shadow, once: each take's held flag is cleared as its slot comes back.
// Done calls it for a request that planned a concurrency rule. A release
// that cannot be written now is owed (payOwedSlots).
func (c *Request) releaseSlots() {
	for _, takes := range [...][]take{c.plan.local, c.plan.shadowLocal} {
		for i := range takes {
			if t := &takes[i]; t.held && t.rule.slots {
				c.giveBackSlot(t)
			}
		}
	}
}

// giveBackSlot gives back the slot the held take t holds: the one way a
// slot comes back, whatever ended its request (Done: releaseSlots; a
// refusal after it was taken, or a hold given up: giveBack). It clears the
// held flag, so a slot comes back once; the release is owed when it
// cannot be written (releaseSlot); and this worker's line for the key is
// woken.
func (c *Request) giveBackSlot(t *take) {
	t.held = false
	t.rule.inFlight.Add(-1)
	c.plugin.releaseSlot(store.Request{ID: t.id, Limit: t.rule.limit, Cost: t.cost})
	if len(c.plugin.slotLine[t.id]) > 0 {
		c.plugin.wakeSlotLine(t.id)
	}
}

// maxSlotsOwed bounds the releases a Plugin keeps to retry; past it a
// release is dropped and counted (slots_lost): its key has one slot less
// until its entry is reclaimed or evicted.
const maxSlotsOwed = 4096

// releaseSlot gives one slot back to the table, or owes it when the write
// fails (a CAS lost slots.MaxAttempts times, or shared data failing): a
// slot never refills, so a release dropped as a token refund is dropped
// would lose it for good.
func (p *Plugin) releaseSlot(r store.Request) {
	if p.table.RefundOne(p.now(), r) == nil {
		return
	}
	if len(p.slotsOwed) >= maxSlotsOwed {
		p.metrics.slotsLost.Increment(1)
		return
	}
	p.slotsOwed = append(p.slotsOwed, r)
}

// payOwedSlots retries the owed releases (Tick, once a second), keeping
// those that fail again.
func (p *Plugin) payOwedSlots() {
	owed := p.slotsOwed
	p.slotsOwed = nil
	for _, r := range owed {
		p.releaseSlot(r)
	}
}

// slotPolicy is a concurrency rule's RateLimit-Policy: the quota and no
// window (slots do not refill over time).
func slotPolicy(quotedName string, maxInFlight int) string {
	return quotedName + ";q=" + strconv.Itoa(maxInFlight)
}

// Waiting for a slot (max_delay_ms on a concurrency rule). A request that
// finds no free slot, and that no other rule refuses, waits for one
// instead of being refused, within its rule's max_delay_ms and max_waiting
// places (claimed as for a token bucket that holds: planRules). It takes a
// ticket of its key's line in shared data (concurrency_line.go): first
// come, first served across the workers of this Envoy, and a request that
// arrives while others wait, in any worker, takes a ticket behind them
// rather than a freed slot. Only the line's head tries for a slot. It also
// waits in its worker's list for the key (slotLine), so a slot freed in
// this worker wakes the first of them at once (Stream.Run); a slot freed in
// another worker, or a turn that came, is seen by a poll (Stream.After),
// every slotPoll at most: shared data has no notification.
//
// The head tries the whole local decision again (all or none, as at
// first); once admitted it leaves the line and goes on with the rest of
// its decision (leases, the limit service), once refused past its bound it
// is answered as any refusal. A request that ends while it waits (Done, or
// Envoy's own answer) leaves the line, counted in delay_abandoned.

// slotPoll bounds how long a waiting request goes without trying again.
const slotPoll = 20 * int64(time.Millisecond)

// waitForSlot reports whether the request refused by rej waits for a slot
// instead (and then it is paused): the refusing take is a slot of a rule
// with max_delay_ms that claimed a place, no other take refused, and the
// key's line has a place.
func (c *Request) waitForSlot(rej *rejection, out []bucket.Decision) bool {
	if rej.reason != reasonConcurrency {
		return false
	}
	var first *take
	for i := range c.plan.local {
		t := &c.plan.local[i]
		if out[i].Allowed {
			continue
		}
		if !t.rule.slots || t.maxWait == 0 {
			if t.rule.slots && t.full {
				t.rule.waitingFull.Increment(1)
			}
			return false
		}
		if first == nil {
			first = t
		}
	}
	if first == nil {
		return false
	}
	return c.startSlotWait(first)
}

// behindSlotLine is for a request that arrives while requests of one of
// its keys wait for a slot, in this worker or another: it takes a ticket
// behind them (waits) rather than a slot freed for them, or is refused at
// once when there is no place left (waiting_full). Neither when no line is
// ahead of it. Only rules with max_delay_ms have lines.
func (c *Request) behindSlotLine() (rej *rejection, waits bool) {
	p := c.plugin
	for i := range c.plan.local {
		t := &c.plan.local[i]
		if !t.rule.slots || t.rule.maxWait == 0 {
			continue
		}
		if len(p.slotLine[t.id]) == 0 && !p.lines.waiting(t.id, c.plan.now) {
			continue
		}
		if t.maxWait > 0 && c.startSlotWait(t) {
			return nil, true
		}
		if t.full || t.maxWait > 0 {
			t.rule.waitingFull.Increment(1)
		}
		return &rejection{rule: t.rule, reason: reasonConcurrency, d: slotDecision(bucket.Decision{})}, false
	}
	return nil, false
}

// startSlotWait puts the request in t's line until its rule's bound; false
// when the line has max_waiting tickets already. A ticket that cannot be
// written (shared data failing) leaves the request waiting without one:
// it tries at each poll, in its worker's order only.
func (c *Request) startSlotWait(t *take) bool {
	p := c.plugin
	ticket, ok, err := p.lines.join(t.id, c.plan.now, t.rule.Limit.MaxWaiting)
	if err == nil && !ok {
		return false
	}
	c.slotWaiting, c.slotID, c.slotTicket = true, t.id, ticket
	c.waitFrom, c.slotUntil = c.plan.now, c.plan.now+t.maxWait
	if p.slotLine == nil {
		p.slotLine = make(map[uint64][]*Request)
	}
	p.slotLine[t.id] = append(p.slotLine[t.id], c)
	t.rule.waitingGauge.Add(1)
	c.pollSlot()
	return true
}

// pollSlot sets the request's next try: slotPoll from now, or its bound.
func (c *Request) pollSlot() {
	now := c.plugin.now()
	gen := c.gen
	err := c.stream.After(max(min(slotPoll, c.slotUntil-now), 1), func() {
		if c.gen == gen && c.slotWaiting {
			c.tryForSlot()
		}
	})
	if err != nil {
		// No timer: the request can wait for no slot; it is refused now.
		c.leaveSlotLine()
		c.slotRefused(false)
	}
}

// slotTurn is where the request stands in its line at now. A request
// without a ticket tries as a head; one that lost its place (its turn
// lapsed, or its line's record was evicted) takes a new ticket at the
// back of both lines.
func (c *Request) slotTurn(now int64) lineTurn {
	p := c.plugin
	if c.slotTicket == 0 {
		return lineHead
	}
	at, err := p.lines.turn(c.slotID, c.slotTicket, now)
	switch {
	case err != nil:
		return lineHead // shared data failing: the worker's order only
	case at != lineLost:
		return at
	}
	ticket, ok, err := p.lines.join(c.slotID, now, c.slotMaxWaiting())
	switch {
	case err != nil:
		c.slotTicket = 0
		return lineHead
	case !ok:
		return lineLost
	}
	c.slotTicket = ticket
	line := p.slotLine[c.slotID]
	for i, r := range line {
		if r == c {
			p.slotLine[c.slotID] = append(append(line[:i], line[i+1:]...), c)
			break
		}
	}
	return lineBehind
}

// slotMaxWaiting is the max_waiting of the rule whose slot the request
// waits for.
func (c *Request) slotMaxWaiting() int {
	for i := range c.plan.local {
		if t := &c.plan.local[i]; t.rule.slots && t.id == c.slotID {
			return t.rule.Limit.MaxWaiting
		}
	}
	return 1
}

// tryForSlot tries the local decision again when it is the request's
// turn; otherwise it polls again, until its bound.
func (c *Request) tryForSlot() {
	p := c.plugin
	now := p.now()
	switch at := c.slotTurn(now); {
	case at != lineHead && now >= c.slotUntil:
		c.leaveSlotLine()
		c.slotRefused(true)
		return
	case at == lineLost: // no place left behind the line
		c.leaveSlotLine()
		c.slotRefused(true)
		return
	case at == lineBehind:
		c.pollSlot()
		return
	}
	c.plan.now = now
	ok, out, err := c.decide(now, c.plan.local)
	switch {
	case err == nil && !ok && now < c.slotUntil:
		c.pollSlot()
		return
	case err == nil && !ok:
		c.leaveSlotLine()
		c.slotRefused(true)
		return
	}
	c.leaveSlotLine()
	c.slotWaited()
	if err != nil {
		for _, t := range c.plan.local {
			t.rule.failedOpen.Increment(1)
		}
	} else {
		for i := range c.plan.local {
			t := &c.plan.local[i]
			t.held, t.d = true, out[i]
			t.rule.allowed.Increment(1)
			if t.rule.slots {
				t.rule.inFlight.Add(1)
				out[i] = slotDecision(out[i])
			}
			c.show(t.rule, out[i])
		}
	}
	c.paused = true
	c.step = stepLeases
	c.next(nil)
	p.wakeSlotLine(c.slotID) // the next in line may find a slot too
}

// slotWaited counts the wait of a request admitted after it.
func (c *Request) slotWaited() {
	c.heldFor = max(c.plugin.now()-c.waitFrom, 1)
	for i := range c.plan.local {
		if t := &c.plan.local[i]; t.rule.slots && t.maxWait > 0 {
			t.rule.delayed.Increment(1)
			t.rule.delayMs.Increment(uint64((c.heldFor + 999_999) / 1e6))
		}
	}
}

// slotRefused answers a waiting request whose bound passed (counted in
// delay_refused when it waited) with its concurrency refusal.
func (c *Request) slotRefused(waited bool) {
	var rej *rejection
	for i := range c.plan.local {
		if t := &c.plan.local[i]; t.rule.slots && t.id == c.slotID {
			rej = &rejection{rule: t.rule, reason: reasonConcurrency, d: slotDecision(bucket.Decision{})}
			break
		}
	}
	if rej == nil {
		return
	}
	if waited {
		rej.rule.delayRefused.Increment(1)
	}
	c.paused = true
	c.end(rej)
}

// leaveSlotLine takes the request out of its line.
func (c *Request) leaveSlotLine() {
	if !c.slotWaiting {
		return
	}
	p := c.plugin
	c.slotWaiting = false
	if c.slotTicket != 0 {
		// An error leaves the ticket to lapse at the head (lineLease).
		_ = p.lines.leave(c.slotID, c.slotTicket, p.now())
		c.slotTicket = 0
	}
	line := p.slotLine[c.slotID]
	for i, r := range line {
		if r == c {
			line = append(line[:i], line[i+1:]...)
			break
		}
	}
	if len(line) == 0 {
		delete(p.slotLine, c.slotID)
	} else {
		p.slotLine[c.slotID] = line
	}
	for i := range c.plan.local {
		if t := &c.plan.local[i]; t.rule.slots && t.id == c.slotID {
			t.rule.waitingGauge.Add(-1)
			break
		}
	}
}

// abandonSlotWait ends the wait of a request that ended (Done, or Envoy
// answered it).
func (c *Request) abandonSlotWait() {
	c.leaveSlotLine()
	for i := range c.plan.local {
		if t := &c.plan.local[i]; t.rule.slots && t.id == c.slotID {
			t.rule.delayAbandon.Increment(1)
			break
		}
	}
	c.releaseClaims(false)
}

// wakeSlotLine lets the first request waiting for a slot of id in this
// Plugin try now (a slot of id was given back here).
func (p *Plugin) wakeSlotLine(id uint64) {
	line := p.slotLine[id]
	if len(line) == 0 {
		return
	}
	w := line[0]
	gen := w.gen
	_ = w.stream.Run(func() { // on failure its poll still comes
		if w.gen == gen && w.slotWaiting {
			w.tryForSlot()
		}
	})
}
