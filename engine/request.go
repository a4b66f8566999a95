package engine

import (
	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/engine/lease"
	"github.com/ratelimit-wasm/tokenbucket/engine/store"
)

// Request decides one request. The host makes one with Plugin.NewRequest
// and may use it again for another request after Done.
type Request struct {
	plugin *Plugin
	stream Stream

	plan plan
	// The decision's progress: the next step (step), and whether the
	// request waits for a call whose answer goes on (paused: cleared when
	// the decision ends, or when the host answered the request itself,
	// after which a late answer changes nothing of the request).
	step   step
	paused bool
	// gen counts the requests this Request has served (Done): an answer
	// to a call the plugin sent for an earlier one is not this request's.
	gen uint64
	// leaseAnswer is the answer to the request's lease call, waiting for
	// Stream.Run to hand it to the request (nil: none). calling: the
	// request is handing its lease call to the host, and early the answer
	// a host gave before that returned.
	leaseAnswer *leaseWait
	calling     bool
	early       *leaseWait
	recalled    bool // a lease call of an ended period was sent again (onLeaseAnswer)
	shadowsSent bool // the shadow cluster rules went out (alone or riding a call)
	// What the response headers report: the enforced rule closest to its
	// limit, or none.
	shown      *rule
	shownLeft  float64
	decision   bucket.Decision
	localReply bool
	// Holding the request until its tokens are there (delay.go): goesAt is
	// when it may go on (Unix ns; 0: at once); holding while a timer
	// waits; heldFor how long it was held from its decision, once it went
	// on (the response header reports it).
	goesAt  int64
	holding bool
	heldFor int64
	// Holding the request on its leases (leasewait.go): leaseHolding while
	// a timer waits for its turn (leaseAt); leaseTurn once its turn came
	// (it spends without queueing behind others); leaseHeld once it was
	// held on its leases at all.
	leaseAt      int64
	leaseHolding bool
	leaseTurn    bool
	leaseHeld    bool
	// Waiting for a slot of a concurrency rule (concurrency.go): in the
	// line of the slot slotID since waitFrom, until slotUntil (Unix ns).
	// slotTicket is its ticket in the key's line (0: none).
	slotWaiting         bool
	cslotWaited         bool // refused a cluster slot, it waited to try again
	slotID, slotTicket  uint64
	waitFrom, slotUntil int64
	// Backing for the request's values (request.values): a request reads
	// a handful, so none is allocated.
	values [4]cachedValue
	// The response's part: costs known from the response and charge_on
	// (response.go).
	body bodyScan
	// The request body's scan, for request_json values (requestbody.go).
	reqBody requestBody
	// identityAsked: accept-encoding was replaced already (requestbody.go).
	identityAsked bool
	// Buffers a callback fills and uses before it returns; they stay with
	// the context when it is reused, so a request allocates none.
	scratch scratch
}

// scratch is one request's working buffers: nothing in them outlives the
// callback that fills them, and they hold no pointers, so a reused context
// keeps them without keeping anything alive.
type scratch struct {
	reqs    []store.Request
	out     []bucket.Decision
	spends  []lease.Spend
	results []lease.Result
	text    []byte // header values being formatted
}

// keep is s emptied, for the context's next request.
func (s *scratch) keep() scratch {
	return scratch{reqs: s.reqs[:0], out: s.out[:0], spends: s.spends[:0], results: s.results[:0], text: s.text[:0]}
}

// decisions is s.out with n elements; s.out is that slice until the next
// call (a reused Request's s.out starts empty: nothing may read it before).
func (s *scratch) decisions(n int) []bucket.Decision {
	if cap(s.out) < n {
		s.out = make([]bucket.Decision, n)
	}
	s.out = s.out[:n]
	return s.out
}

// leaseResults is s.results with n elements.
func (s *scratch) leaseResults(n int) []lease.Result {
	if cap(s.results) < n {
		s.results = make([]lease.Result, n)
	}
	return s.results[:n]
}

// step is where a request's decision stands: the enforced local rules are
// decided in OnRequestHeaders, then the leased cluster rules, then the
// per-request cluster rules, each of which may wait for a call.
type step uint8

const (
	stepLeases step = iota
	stepSlots
	stepShadowSlots
	stepCluster
	stepDone
)

// NewRequest returns a Request on s for the host to drive: OnRequestHeaders,
// then the response's callbacks, then Done.
func (p *Plugin) NewRequest(s Stream) *Request { return &Request{plugin: p, stream: s} }

// Done ends the request's life in the engine: a body scan still waiting
// (a reset, or the client gone, before the body's end) is settled as cut
// short, and a lease answer not yet handed to the request is recorded in
// the leases, its grant whole. The Request is then empty, holding only its
// scratch buffers, and the host may use it for another request of the same
// plugin. An answer to a callout of this request (Stream.Callout) that
// arrives later must not be delivered (a proxy-wasm host drops it with the
// context); the calls the plugin owns (shadows, leases) keep their own
// takes, never the request's, and find the request gone by its gen. Done
// is idempotent.
func (c *Request) Done() {
	if c.slotWaiting {
		c.abandonSlotWait() // it ended while it waited for a slot
	}
	if c.holding {
		c.abandon() // the client went away, or Envoy ended the stream
	}
	if c.leaseHolding {
		c.abandonLeaseHold()
	}
	c.releaseClaims(false) // a request that ended while it waited for an answer
	if c.plan.slots {
		c.releaseSlots() // however the stream ended
		c.releaseClusterSlots()
	}
	if c.body.active {
		c.cutShort()
	}
	if w := c.leaseAnswer; w != nil {
		c.leaseAnswer = nil
		c.plugin.recordLeaseAnswer(w)
	}
	if c.reqBody.waiting {
		c.reqBody.waiting = false
		c.plugin.bodyHeld -= c.reqBody.held // the request ended before its body
	}
	p, s, gen := c.plugin, c.stream, c.gen+1
	keep, scans := c.scratch.keep(), c.reqBody.scans[:0]
	*c = Request{} // drop every reference
	c.plugin, c.stream, c.scratch, c.gen = p, s, keep, gen
	c.reqBody.scans = scans
}

// rejection is why a request is answered by the plugin.
type rejection struct {
	rule   *rule
	reason string
	d      bucket.Decision // token_bucket_exceeded: what the headers report
	// full: the rule held max_waiting requests already, so it could not
	// hold this one (delay.go).
	full bool
}

// Reasons named in the X-RateLimit-Reason header and the JSON body.
const (
	reasonExceeded    = "token_bucket_exceeded"
	reasonCostTooHigh = "cost_exceeds_burst"
	reasonMissingKey  = "missing_limit_key"
	reasonServiceDown = "limit_service_unavailable"
	// reasonConcurrency (concurrency.go): concurrency_limit_exceeded
)

// OnRequestHeaders decides the request from its headers: read the request
// once, decide once, answer once (Pause: it waits for a call, or the
// engine answered it).
func (c *Request) OnRequestHeaders() Action {
	p := c.plugin
	c.plan = plan{now: p.now()}
	c.plan.local = c.plan.buf[:0]
	if !p.keyed {
		p.keyIdentities()
	}
	var s Stream = c.stream
	if hs := c.reqBody.headers; hs != nil {
		s = heldHeaders{Stream: c.stream, headers: hs} // decided after the body (requestbody.go)
	}
	rej := c.planRules(&requestValues{s: s, cfg: p.cfg, values: c.values[:0], body: c})
	if p.readsBody {
		c.askIdentityEncoding()
	}
	c.decideShadows()
	if rej == nil && c.plan.slots {
		var waits bool
		if rej, waits = c.behindSlotLine(); waits {
			c.step = stepLeases
			return Pause // it waits behind others for a slot (concurrency.go)
		}
	}
	if rej == nil {
		rej = c.enforceLocal()
		if rej != nil && rej.reason == reasonConcurrency && c.waitForSlot(rej, c.scratch.out) {
			c.step = stepLeases
			return Pause // it waits for a slot (concurrency.go)
		}
	}
	c.step = stepLeases
	return c.next(rej)
}

// OnRequestHeadersWithBody is OnRequestHeaders for a request whose body
// follows its headers: when the configuration reads request bodies, the
// request is held (Pause) until OnRequestBody or OnRequestTrailers
// decides it (requestbody.go); otherwise it is decided now.
func (c *Request) OnRequestHeadersWithBody() Action {
	if len(c.plugin.bodyPaths) == 0 {
		return c.OnRequestHeaders()
	}
	return c.awaitBody()
}

// next goes on with the request's decision after a step that rejected it
// (rej) or admitted it so far (nil): it runs the remaining steps until one
// waits for a call (the request pauses; the call's answer calls next
// again) or none is left, and then ends the request. Every step and every
// answer returns through here, so a request ends in one place: end.
func (c *Request) next(rej *rejection) Action {
	for rej == nil && c.step != stepDone {
		wait := false
		switch c.step {
		case stepLeases:
			c.step = stepSlots
			if len(c.plan.leased) > 0 {
				rej, wait = c.spendLeases()
			}
		case stepSlots:
			c.step = stepShadowSlots
			if len(c.plan.slotsC) > 0 {
				rej, wait = c.acquireSlots(false)
			}
		case stepShadowSlots:
			c.step = stepCluster
			if len(c.plan.shadowSlotsC) > 0 {
				rej, wait = c.acquireSlots(true)
			}
		case stepCluster:
			c.step = stepDone
			if len(c.plan.cluster) > 0 {
				rej, wait = c.dispatch()
			}
		}
		if wait {
			c.paused = true
			return Pause
		}
	}
	return c.end(rej)
}

// end ends the request's decision, once: with a rejection, everything the
// request took is given back (the one place a refund happens) and the
// reply is sent; the shadow cluster rules that no call carried go out
// alone; a paused request is resumed unless the reply answered it. It
// returns the action for the request-headers callback (a callout's answer
// ignores it).
func (c *Request) end(rej *rejection) Action {
	paused := c.paused
	c.step, c.paused = stepDone, false
	if rej != nil {
		c.giveBack()
		c.countDelayRefusal(rej)
		c.releaseClaims(false)
	}
	if rej == nil && c.leaseHeld {
		c.leaseWentOn(c.plugin.now())
	}
	if !c.shadowsSent && len(c.plan.shadowC) > 0 {
		c.dispatchShadow()
	}
	if rej != nil && c.sendReply(*rej) {
		return Pause
	}
	if rej == nil && c.goesAt > 0 && c.hold() {
		return Pause // hold keeps the places of the rules that hold it
	}
	c.releaseClaims(false)
	if paused {
		c.resume()
	}
	return Continue
}

// waiting reports whether the request still waits for the answer of a
// call: false once Envoy answered it itself (a stream timeout, a reset),
// when a late answer may only record what it says of the buckets.
func (c *Request) waiting() bool { return c.paused }
