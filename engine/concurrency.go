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
// filter's reply, a drain), gives back what is still held (releaseSlots),
// clearing the flag, so a slot comes back exactly once. A request admitted
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
				t.held = false
				t.rule.inFlight.Add(-1)
				c.plugin.releaseSlot(store.Request{ID: t.id, Limit: t.rule.limit, Cost: t.cost})
			}
		}
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
