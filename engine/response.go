package engine

import (
	"strconv"
	"strings"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/engine/lease"
	"github.com/ratelimit-wasm/tokenbucket/engine/store"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// The response's part of a request, one way and in order:
//
//  1. OnResponseHeaders: when a rule of the request settles with the
//     response (plan.charges), the takes that actually hold tokens are
//     settled: a status that charge_on does not list refunds the
//     reservation; a response_header cost charges the difference at once;
//     a response_json cost waits for the body, unless the body is encoded
//     (content-encoding other than identity: it is charged truncated_cost
//     at once) or the VM's budget of in-flight scans is spent (the cost is
//     missing). Then the RateLimit headers go out, describing the buckets
//     after what was settled.
//  2. OnResponseBody: only when a response_json cost waits
//     (bodyScan.active). Every chunk continues at once, and is read in
//     pieces of at most bodyPiece bytes, only as far as some target still
//     needs it; each piece is scanned as it passes (package jsonpath; an
//     event stream by events, eventStream) and never kept. At the end of
//     the stream (or at its trailers) the costs found are charged.
//  3. Done: a body that never reached its end (a reset, the
//     client gone) is cut short: it is charged truncated_cost and counted
//     in cost_truncated, unless an event stream already marked its cost
//     final (an end event after it).
//
// A missing or unusable cost keeps the reservation and counts in the rule's
// cost_missing. Nothing here rejects or delays a response.

// bodyPiece is the most of a body chunk read from the host at once: a
// chunk of any size costs the VM at most this much at a time.
const bodyPiece = 64 << 10

// maxBodyHeld is a VM's budget for the state of in-flight body scans
// (ScanBytes per response_json rule of a response): past it, a response's
// cost is missing (counted) rather than scanned. At about 330 bytes a
// target it admits some 12,000 concurrent scans per worker.
const maxBodyHeld = 4 << 20

// bodyScan is the response_json costs waiting for the body.
type bodyScan struct {
	active bool
	stream bool // text/event-stream: scanned by events
	failed bool // a piece could not be read: every target misses
	max    int  // the largest max_body_bytes of the targets
	size   int  // body bytes seen (a JSON body)
	held   int  // bytes of the VM's budget this scan holds
	events eventStream
	takes  []*take // the takes waiting, parallel to targets
	// targets are the takes' paths, each with its own scanner.
	targets []bodyTarget
	// Backing for the usual one or two waiting takes.
	takesBuf   [2]*take
	targetsBuf [2]bodyTarget
}

// OnResponseHeaders settles what the response decides (see above) and adds
// the RateLimit headers to allowed responses; a local reply of ours already
// has them.
func (c *Request) OnResponseHeaders(endOfStream bool) Action {
	// A request still waiting for a call was answered by Envoy itself (a
	// stream timeout): its decision is over, and the call's answer, if it
	// comes, changes nothing of it.
	c.paused = false
	if c.slotWaiting {
		c.abandonSlotWait() // Envoy answered it while it waited for a slot
	}
	if c.holding {
		c.abandon() // Envoy answered the held request itself (a timeout)
	}
	if c.leaseHolding {
		c.abandonLeaseHold()
	}
	if c.localReply {
		return Continue
	}
	if c.plan.charges {
		c.settleHeaders(endOfStream)
	}
	if c.shown == nil {
		return Continue
	}
	p := c.plugin
	add := func(name, value string) {
		if err := c.stream.AddResponseHeader(name, value); err != nil {
			p.warn(&p.headerLog, "adding response header "+name+": "+err.Error())
		}
	}
	c.rateLimitHeaders(c.shown, c.decision, add)
	if c.heldFor > 0 {
		c.delayHeader(add)
	}
	return Continue
}

// OnResponseBody takes a chunk of size bytes of the response body. It never
// holds a chunk, and reads of it only what some target still needs, in
// pieces.
func (c *Request) OnResponseBody(size int, endOfStream bool) Action {
	if !c.body.active {
		return Continue
	}
	b := &c.body
	if !b.stream && b.size+size > b.max {
		// Past every target's bound: the rest is not read.
		for i := range b.targets {
			b.targets[i].skip = true
		}
		b.size += size
	}
	for off := 0; off < size && b.wants(); {
		n := min(size-off, bodyPiece)
		piece, err := c.stream.ResponseBody(off, n)
		if err != nil {
			p := c.plugin
			p.warn(&p.headerLog, "reading the response body: "+err.Error())
			b.failed = true
			break
		}
		b.write(piece)
		off += n
	}
	if endOfStream {
		c.finishBody()
	}
	return Continue
}

// OnResponseTrailers: trailers end the body.
func (c *Request) OnResponseTrailers() Action {
	if c.body.active {
		c.finishBody()
	}
	return Continue
}

// wants reports whether the rest of the body may still change a cost.
func (b *bodyScan) wants() bool {
	if b.failed {
		return false
	}
	if b.stream {
		return true // a later event may carry the path
	}
	for i := range b.targets {
		if !b.targets[i].skip {
			return true
		}
	}
	return false
}

// write scans one piece of the body.
func (b *bodyScan) write(piece []byte) {
	if b.stream {
		b.events.write(piece, b.targets)
		return
	}
	b.size += len(piece)
	for i := range b.targets {
		b.targets[i].write(piece, b.size)
	}
}

// endScan stops the scan and gives its share of the VM's budget back.
func (c *Request) endScan() {
	b := &c.body
	b.active = false
	c.plugin.bodyHeld -= b.held
	b.held = 0
}

// finishBody charges the costs the body gave, and counts those it did not.
func (c *Request) finishBody() {
	c.endScan()
	b := &c.body
	if b.stream {
		b.events.end(b.targets)
	} else {
		for i := range b.targets {
			b.targets[i].end()
		}
	}
	c.settle(b.charge(false))
}

// charge sets the amounts of the takes from their targets at the body's
// end (cut: the body was cut short) and returns the takes, each once. A
// take of a price table holds one target per term, consecutive (money.go).
func (b *bodyScan) charge(cut bool) []*take {
	takes := b.takes[:0]
	for i := 0; i < len(b.targets); {
		t := b.takes[i]
		if t.rule.Cost.Money != nil {
			n := len(t.rule.termPaths)
			chargeMoney(t, b.targets[i:i+n], b.failed, b.stream, cut)
			takes = append(takes, t)
			i += n
			continue
		}
		tg := &b.targets[i]
		i++
		takes = append(takes, t)
		if cut {
			if b.stream && !b.failed && tg.final && tg.ok {
				t.amount = tg.cost - t.cost
				continue
			}
			t.amount = t.rule.Cost.Truncated - t.cost
			t.rule.costTruncated.Increment(1)
			continue
		}
		if b.failed || !tg.found || !tg.ok {
			t.rule.costMissing.Increment(1)
			continue
		}
		t.amount = tg.cost - t.cost
	}
	return takes
}

// cutShort settles a body that ended before its end of stream: the client
// went away or the stream was reset, so what arrived may be any prefix the
// client chose. Each take is charged its rule's truncated_cost (counted in
// cost_truncated), except that an event stream that already marked its
// end (an end event, see eventStream) after its cost is charged that cost:
// a count the stream has not marked final is a running count, never the
// bill.
func (c *Request) cutShort() {
	c.endScan()
	c.settle(c.body.charge(true))
}

// askIdentityEncoding asks the upstream for a body without content coding
// when a rule of the request reads its cost from the body (response_json):
// the plugin does not decode bodies, and a client must not lower its cost
// by accepting gzip. It replaces the request's accept-encoding (absent
// means any coding) with identity. Called once the rules are planned, when
// a rule of the configuration reads the body (Plugin.readsBody).
func (c *Request) askIdentityEncoding() {
	if c.identityAsked {
		return
	}
	if c.reqBody.waiting {
		// Before the plan (OnRequestHeadersWithBody): asked for every
		// request of a configuration that reads response bodies.
		c.identityAsked = true
		if err := c.stream.ReplaceRequestHeader("accept-encoding", "identity"); err != nil {
			p := c.plugin
			p.warn(&p.headerLog, "replacing accept-encoding: "+err.Error())
		}
		return
	}
	pl := &c.plan
	for _, takes := range [...][]take{pl.local, pl.cluster, pl.leased, pl.shadowLocal, pl.shadowC} {
		for i := range takes {
			if takes[i].rule.Cost.Source.Kind != config.SourceResponseJSON {
				continue
			}
			if err := c.stream.ReplaceRequestHeader("accept-encoding", "identity"); err != nil {
				p := c.plugin
				p.warn(&p.headerLog, "replacing accept-encoding: "+err.Error())
			}
			return
		}
	}
}

// settleHeaders settles the takes that the response's headers decide
// (settleByHeaders), and starts the body scans of the response_json costs
// (startScans).
func (c *Request) settleHeaders(endOfStream bool) {
	var settledBuf [4]*take
	settled := settledBuf[:0]
	h := responseHeaders{stream: c.stream}
	b := &c.body
	b.takes, b.targets = b.takesBuf[:0], b.targetsBuf[:0]
	pl := &c.plan
	for _, takes := range [...][]take{pl.local, pl.shadowLocal, pl.cluster, pl.leased, pl.shadowC} {
		for i := range takes {
			t := &takes[i]
			if !t.held || !t.rule.charges {
				continue
			}
			switch settleByHeaders(t, &h, endOfStream) {
			case settledNow:
				settled = append(settled, t)
			case readsBody:
				ru := t.rule
				if ru.Cost.Money != nil {
					for _, path := range ru.termPaths { // one target a term (money.go)
						b.takes = append(b.takes, t)
						b.targets = append(b.targets, bodyTarget{path: path, max: ru.Cost.MaxBodyBytes})
					}
				} else {
					b.takes = append(b.takes, t)
					b.targets = append(b.targets, bodyTarget{path: ru.costPath, max: ru.Cost.MaxBodyBytes})
				}
				b.max = max(b.max, ru.Cost.MaxBodyBytes)
			}
		}
	}
	c.startScans()
	if c.settle(settled) {
		c.reshow() // the headers still to be sent report the buckets after the charge
	}
}

// responseHeaders reads the response headers settleByHeaders needs, each
// at most once a response.
type responseHeaders struct {
	stream                           Stream
	status                           int
	statusRead, encoded, encodedRead bool
}

// statusCode is the response's status, 0 when unreadable.
func (h *responseHeaders) statusCode() int {
	if !h.statusRead {
		h.statusRead = true
		if v, ok := h.stream.ResponseHeader(":status"); ok {
			h.status, _ = strconv.Atoi(v)
		}
	}
	return h.status
}

// isEncoded reports whether the response's body has a content coding.
func (h *responseHeaders) isEncoded() bool {
	if !h.encodedRead {
		h.encodedRead = true
		v, found := h.stream.ResponseHeader("content-encoding")
		h.encoded = found && isEncoded(v)
	}
	return h.encoded
}

// headersVerdict is what the response's headers make of a take.
type headersVerdict uint8

const (
	unsettled  headersVerdict = iota // nothing to charge (its cost missing is counted)
	settledNow                       // t.amount is set
	readsBody                        // its cost is in the body (response_json)
)

// settleByHeaders decides what the response's headers make of a held take
// of a rule that charges by the response: a status charge_on does not list
// gives back its cost; a response_header cost sets its amount; a
// response_json cost waits for the body, unless there is none (missing) or
// it is encoded (charged as a body cut short: not decoded here).
func settleByHeaders(t *take, h *responseHeaders, endOfStream bool) headersVerdict {
	ru := t.rule
	if ru.ChargeOn.Listed {
		if status := h.statusCode(); status != 0 && !ru.ChargeOn.Has(status) {
			t.amount = -t.cost // not an outcome this rule counts
			return settledNow
		}
	}
	switch ru.Cost.Source.Kind {
	case config.SourceResponseHeader:
		v, found := h.stream.ResponseHeader(ru.Cost.Source.Name)
		cost, ok := parseResponseCost(v)
		if !found || !ok {
			ru.costMissing.Increment(1)
			return unsettled
		}
		t.amount = cost - t.cost
		return settledNow
	case config.SourceResponseJSON:
		if endOfStream {
			ru.costMissing.Increment(1) // no body at all
			return unsettled
		}
		if ru.Cost.Money != nil && t.prices == nil {
			return unsettled // no price: the reservation stands (price_missing)
		}
		if h.isEncoded() {
			t.amount = ru.Cost.Truncated - t.cost
			if ru.Cost.Money != nil {
				t.amount = 0 // charged its reservation
			}
			ru.costTruncated.Increment(1)
			return settledNow
		}
		return readsBody
	}
	return unsettled
}

// startScans starts the body scans settleHeaders left to the body, within
// the VM's budget for scans in flight (Plugin.bodyBudget): past it, their
// costs are counted missing.
func (c *Request) startScans() {
	b := &c.body
	n := len(b.takes)
	if n == 0 {
		return
	}
	p := c.plugin
	if p.bodyHeld+n*ScanBytes > p.bodyBudget {
		for i, t := range b.takes {
			if i == 0 || b.takes[i-1] != t { // a price table's take holds a target a term
				t.rule.costMissing.Increment(1)
			}
		}
		p.warn(&p.headerLog, "response body scans past the VM's budget of "+strconv.Itoa(p.bodyBudget)+" bytes: costs counted missing")
		return
	}
	b.active = true
	b.held = n * ScanBytes
	p.bodyHeld += b.held
	for i := range b.targets {
		b.targets[i].reset()
	}
	if v, ok := c.stream.ResponseHeader("content-type"); ok && isEventStream(v) {
		b.stream = true
	}
}

// isEncoded reports whether a content-encoding names a coding other than
// identity.
func isEncoded(v string) bool {
	v = strings.TrimSpace(v)
	return v != "" && !strings.EqualFold(v, "identity")
}

// isEventStream reports whether a content-type is text/event-stream.
func isEventStream(ct string) bool {
	const want = "text/event-stream"
	if len(ct) < len(want) {
		return false
	}
	for i := 0; i < len(want); i++ {
		ch := ct[i]
		if 'A' <= ch && ch <= 'Z' {
			ch += 'a' - 'A'
		}
		if ch != want[i] {
			return false
		}
	}
	return len(ct) == len(want) || ct[len(want)] == ';' || ct[len(want)] == ' '
}

// settle applies the amounts of takes to their buckets: the local ones in
// shared data now (each bucket on its own: a charge cannot be refused), the
// cluster ones through the limit service, sent without holding the
// response. An amount is clamped to what can change a bucket (clampCharge)
// and an amount of 0 changes nothing and sends nothing. Each take's d
// becomes what its bucket holds after the charge (a cluster bucket's as
// estimated from the service's answer less the amount). It reports whether
// it settled anything.
func (c *Request) settle(takes []*take) bool {
	if len(takes) == 0 {
		return false
	}
	p := c.plugin
	now := p.now()
	var sendBuf [4]*take
	send := sendBuf[:0] // amounts for the limit service
	for _, t := range takes {
		t.amount = clampCharge(t.amount, t.rule.limit.Burst)
		switch {
		case t.rule.Scope == config.ScopeLocal:
			c.chargeLocal(t, now)
		case t.amount == 0:
			// Nothing to send; the headers report the bucket as decided.
		case t.rule.Sync == config.SyncLease && t.rule.Mode == config.ModeEnforce:
			// The lease in hand takes the adjustment: a refund goes back
			// into it, a debit comes out of it; what it cannot cover is
			// charged to the global bucket.
			if rest := c.chargeLease(t, now); rest > 0 {
				t.amount = rest
				send = append(send, t)
			}
		default:
			t.d = t.rule.limit.Report(float64(t.d.Remaining)-t.amount, 0, 0, true)
			send = append(send, t)
		}
	}
	if len(send) > 0 {
		c.chargeCluster(send)
	}
	return true
}

// reshow makes the response headers report, again, the enforced bucket
// closest to its limit among those the request holds, as they are now.
func (c *Request) reshow() {
	c.shown = nil
	for _, takes := range [...][]take{c.plan.local, c.plan.cluster, c.plan.leased} {
		for i := range takes {
			if takes[i].held {
				c.show(takes[i].rule, takes[i].d)
			}
		}
	}
}

// clampCharge bounds an amount to what can change a bucket of burst: a
// bucket holds at most burst and owes at most burst, so no charge moves it
// by more than 2 × burst, and no refund gives back more than a full burst.
func clampCharge(amount, burst float64) float64 {
	return max(min(amount, 2*burst), -burst)
}

// chargeLocal applies t's amount to its local bucket; t.d becomes what the
// bucket holds after it (as it is, for an amount of 0). A charge that
// cannot be written counts in the rule's failed_open: the request went
// through without paying it.
func (c *Request) chargeLocal(t *take, now int64) {
	p := c.plugin
	reqs := [1]store.Request{{ID: t.id, Limit: t.rule.limitAt(now), Cost: t.amount}}
	var out [1]bucket.Decision
	_, o, err := p.table.Charge(now, reqs[:], out[:])
	p.count(o)
	if err != nil {
		t.rule.failedOpen.Increment(1)
		p.warn(&p.failLog, "charging a cost known from the response (counted in rule."+t.rule.Name+".failed_open): "+err.Error())
		return
	}
	t.d = out[0]
}

// chargeLease applies t's amount to its lease (sync lease) and returns what
// the lease could not cover, for the global bucket; t.d becomes what the
// response headers report. The change is a pure function of the record;
// what it covered comes from the write that won.
func (c *Request) chargeLease(t *take, now int64) (rest float64) {
	p := c.plugin
	amount := t.amount
	ch, err := p.updateLease(t.id, now, func(r lease.Record) (lease.Record, bool) {
		use := min(r.Tokens, amount) // a refund (amount < 0) goes back whole
		r.Tokens -= use
		r.Spent = max(r.Spent+use, 0)
		return r, true
	})
	if err != nil {
		// The lease could not be written: all of a debit goes to the
		// global bucket; a refund is dropped (under-admission).
		p.warn(&p.failLog, "charging a lease: "+err.Error())
		return max(amount, 0)
	}
	t.d = leaseDecision(t.rule, &ch.After, now)
	return amount - min(ch.Before.Tokens, amount)
}

// chargeCluster sends the cluster takes' amounts to the limit service in one
// charge call (POST charge_path), detached from the request: the plugin
// context owns it, so the response is never held and a late answer is
// still counted. A call that fails counts in service_errors; its charge is
// lost (the reservation stands).
func (c *Request) chargeCluster(takes []*take) {
	p := c.plugin
	req := &wire.ChargeRequest{Buckets: make([]wire.ChargeBucket, len(takes))}
	counted := make([]take, len(takes)) // for serviceFailed: rule and service
	for i, t := range takes {
		req.Buckets[i] = wire.ChargeBucket{Key: t.key, Rate: t.rule.limit.Rate, Burst: t.rule.limit.Burst,
			Amount: clampCharge(t.amount, t.rule.limit.Burst), Period: periodOf(t.rule, p.now())}
		counted[i] = take{rule: t.rule}
	}
	s := takes[0].rule.Service // config.Parse: one service for all cluster rules
	answer := func(a *Answer) {
		raw, why := answerBody(a)
		if why == "" {
			if _, err := wire.DecodeChargeAnswer(raw, req); err != nil {
				why = "malformed response body: " + err.Error()
			}
		}
		if why != "" {
			p.serviceFailed(counted, "charge call: "+why)
		}
	}
	p.metrics.chargeCalls.Increment(1)
	err := post(p.host, s, s.ChargePath, wire.AppendChargeRequest(make([]byte, 0, 128*len(takes)), req), answer)
	if err != nil {
		p.serviceFailed(counted, "dispatching the charge call: "+err.Error())
	}
}
