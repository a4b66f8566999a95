package plugin

import (
	"hash"
	"strconv"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/lease"
	"github.com/ratelimit-wasm/tokenbucket/store"
)

// httpContext decides one request.
type httpContext struct {
	types.DefaultHttpContext
	plugin *pluginContext
	id     uint32

	plan plan
	// The decision's progress: the next step (step), whether the request
	// waits for a call whose answer goes on (paused), and whether the
	// decision is over (ended: continued, rejected, or answered by Envoy
	// itself, after which a late answer changes nothing of the request).
	step        step
	paused      bool
	ended       bool
	shadowsSent bool // the shadow cluster rules went out (alone or riding a call)
	// What the response headers report: the enforced rule closest to its
	// limit, or none.
	shown      *rule
	shownLeft  float64
	decision   bucket.Decision
	localReply bool
	// Backing for the request's values (request.values): a request reads
	// a handful, so none is allocated.
	values [4]cachedValue
	// The response's part: costs known from the response and charge_on
	// (response.go).
	body bodyScan
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
	results []lease.Result
	text    []byte // header values being formatted
}

// keep is s emptied, for the context's next request.
func (s *scratch) keep() scratch {
	return scratch{reqs: s.reqs[:0], out: s.out[:0], results: s.results[:0], text: s.text[:0]}
}

// decisions is s.out with n elements.
func (s *scratch) decisions(n int) []bucket.Decision {
	if cap(s.out) < n {
		s.out = make([]bucket.Decision, n)
	}
	return s.out[:n]
}

// leaseResults is s.results with n elements.
func (s *scratch) leaseResults(n int) []lease.Result {
	if cap(s.results) < n {
		s.results = make([]lease.Result, n)
	}
	return s.results[:n]
}

// step is where a request's decision stands: the enforced local rules are
// decided in OnHttpRequestHeaders, then the leased cluster rules, then the
// per-request cluster rules, each of which may wait for a call.
type step uint8

const (
	stepLeases step = iota
	stepCluster
	stepDone
)

// maxFreeContexts bounds the contexts a plugin context keeps for reuse
// (pluginContext.free): a burst of concurrent requests leaves at most that
// many behind, about 1.6 KB each (with a response_json scan state inline).
const maxFreeContexts = 128

// OnHttpStreamDone implements types.HttpContext: the SDK forgets the
// context after this (natively after proxy_on_log; on wasip1 our glue calls
// it from proxy_on_delete, since proxy_on_log is not exported), so its
// memory serves a later request. An answer to a callout of this request
// that arrives later is dropped by the SDK (its context id is gone), and
// shadow callouts keep their own takes, never the context's.
func (c *httpContext) OnHttpStreamDone() {
	p := c.plugin
	if p == nil {
		return // already free (a host calling both proxy_on_log and proxy_on_delete)
	}
	if c.body.active {
		c.cutShort() // a reset, or the client gone, before the body's end
	}
	keep := c.scratch.keep()
	*c = httpContext{} // drop every reference: the free list holds nothing alive
	c.scratch = keep
	if len(p.free) < maxFreeContexts {
		p.free = append(p.free, c)
	}
}

// take is one bucket a request asks of one rule.
type take struct {
	rule *rule
	id   uint64 // the bucket in this Envoy (shared data), and the jitter's key
	key  string // the bucket in the limit service (cluster rules)
	cost float64
	// held: the cost was taken from the bucket (a local bucket, a lease or
	// the limit service's bucket) and not given back. It is the one record
	// of what the request took: a refund gives back exactly the held takes
	// and clears them, and a response charges or refunds only held takes.
	// d is the decision that took it.
	held bool
	d    bucket.Decision
	// amount is the adjustment the response asks for: the real cost less
	// cost, or −cost for a status charge_on does not list.
	amount float64
}

// plan is one request's decision in the making. It lives on the httpContext
// because a cluster rule's answer arrives in a later callback.
type plan struct {
	now                  int64
	local, cluster       []take // enforced rules (cluster: sync per_request)
	leased               []take // enforced cluster rules with sync lease
	shadowLocal, shadowC []take // shadow rules, decided on their own
	spends               []lease.Spend
	// charges: some take's rule settles with the response (a cost known
	// from the response, or charge_on).
	charges bool
	buf     [4]take // backing for the usual handful of takes
}

// rejection is why a request is answered by the plugin.
type rejection struct {
	rule   *rule
	reason string
	d      bucket.Decision // token_bucket_exceeded: what the headers report
	id     uint64          // the bucket: keys Retry-After's jitter
}

// Reasons named in the X-RateLimit-Reason header and the JSON body.
const (
	reasonExceeded    = "token_bucket_exceeded"
	reasonCostTooHigh = "cost_exceeds_burst"
	reasonMissingKey  = "missing_limit_key"
	reasonServiceDown = "limit_service_unavailable"
)

// OnHttpRequestHeaders implements types.HttpContext: read the request once,
// decide once, answer once.
func (c *httpContext) OnHttpRequestHeaders(int, bool) types.Action {
	p := c.plugin
	c.plan = plan{now: p.now()}
	c.plan.local = c.plan.buf[:0]
	rej := c.planRules(&request{cfg: p.cfg, values: c.values[:0]})
	c.askIdentityEncoding()
	c.decideShadows()
	if rej == nil {
		rej = c.enforceLocal()
	}
	c.step = stepLeases
	return c.next(rej)
}

// next goes on with the request's decision after a step that rejected it
// (rej) or admitted it so far (nil): it runs the remaining steps until one
// waits for a call (the request pauses; the call's answer calls next
// again) or none is left, and then ends the request. Every step and every
// answer returns through here, so a request ends in one place: end.
func (c *httpContext) next(rej *rejection) types.Action {
	for rej == nil && c.step != stepDone {
		wait := false
		switch c.step {
		case stepLeases:
			c.step = stepCluster
			if len(c.plan.leased) > 0 {
				rej, wait = c.spendLeases()
			}
		case stepCluster:
			c.step = stepDone
			if len(c.plan.cluster) > 0 {
				rej, wait = c.dispatch()
			}
		}
		if wait {
			c.paused = true
			return types.ActionPause
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
func (c *httpContext) end(rej *rejection) types.Action {
	paused := c.paused
	c.step, c.paused, c.ended = stepDone, false, true
	if rej != nil {
		c.giveBack()
	}
	if !c.shadowsSent && len(c.plan.shadowC) > 0 {
		c.dispatchShadow()
	}
	if rej != nil && c.sendReply(*rej) {
		return types.ActionPause
	}
	if paused {
		resume(c.plugin)
	}
	return types.ActionContinue
}

// waiting reports whether the request still waits for the answer of a
// call: false once Envoy answered it itself (a stream timeout, a reset),
// when a late answer may only record what it says of the buckets.
func (c *httpContext) waiting() bool { return c.paused && !c.ended }

// planRules walks the rules once and fills c.plan with the buckets the
// request takes; it stops at a rule that rejects the request outright
// (missing_key "deny", a cost above the burst).
//
// Tiers: among rules of one group, the first member that applies counts. A
// member applies when it matches and is an allow rule, or yields a bucket
// (its keys are present, or missing_key is "shared"), or rejects for
// missing_key "deny"; one that matches but lacks a key with "skip" does not
// apply, and the next member is tried.
func (c *httpContext) planRules(r *request) *rejection {
	p := c.plugin
	var claimedBuf [4]string
	claimed := claimedBuf[:0] // groups whose member applied
	for _, ru := range p.rules {
		if ru.Group != "" && contains(claimed, ru.Group) {
			continue
		}
		if !r.matches(ru.Match, p.metrics.longValues) {
			continue
		}
		if ru.Action == config.ActionAllow {
			return nil // exempt from every later rule
		}
		id, key, present := identity(ru, r)
		if !present {
			switch ru.MissingKey {
			case config.MissingSkip:
				continue // does not apply
			case config.MissingDeny:
				if ru.Group != "" {
					claimed = append(claimed, ru.Group)
				}
				if ru.Mode == config.ModeShadow {
					c.shadowRejected(ru)
					continue
				}
				return &rejection{rule: ru, reason: reasonMissingKey}
			}
			// MissingShared: id is the rule's one bucket for such requests.
		}
		if ru.Group != "" {
			claimed = append(claimed, ru.Group)
		}
		t := take{rule: ru, id: id, key: key, cost: requestCost(ru, r)}
		if t.cost > ru.limit.Burst {
			if ru.Mode == config.ModeShadow {
				c.shadowRejected(ru)
				continue
			}
			return &rejection{rule: ru, reason: reasonCostTooHigh}
		}
		pl := &c.plan
		pl.charges = pl.charges || ru.charges
		switch cluster := ru.Scope == config.ScopeCluster; {
		case ru.Mode == config.ModeShadow && cluster:
			pl.shadowC = append(pl.shadowC, t)
		case ru.Mode == config.ModeShadow:
			pl.shadowLocal = append(pl.shadowLocal, t)
		case cluster && ru.Sync == config.SyncLease:
			pl.leased = append(pl.leased, t)
		case cluster:
			pl.cluster = append(pl.cluster, t)
		default:
			pl.local = append(pl.local, t)
		}
	}
	return nil
}

// decideShadows runs each local shadow rule's bucket on its own: it consumes
// as an enforced rule would, counts what it would reject, and never rejects.
func (c *httpContext) decideShadows() {
	for i := range c.plan.shadowLocal {
		t := &c.plan.shadowLocal[i]
		ok, _, err := c.decide(c.plan.now, c.plan.shadowLocal[i:i+1])
		switch {
		case err != nil:
			t.rule.failedOpen.Increment(1)
		case ok:
			t.held = true
			t.rule.allowed.Increment(1)
		default:
			c.shadowRejected(t.rule)
		}
	}
}

// enforceLocal decides the enforced local rules as one atomic stack. On a
// shared-data error it fails open: nothing was consumed, the rules count it.
func (c *httpContext) enforceLocal() *rejection {
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
		c.show(t.rule, out[i])
	}
	return nil
}

// decide takes every take's cost from its bucket in shared data, all or
// nothing; out (the request's scratch) holds the decisions until the next
// call.
func (c *httpContext) decide(now int64, takes []take) (ok bool, out []bucket.Decision, err error) {
	p, s := c.plugin, &c.scratch
	s.reqs = s.reqs[:0]
	for _, t := range takes {
		s.reqs = append(s.reqs, store.Request{ID: t.id, Limit: t.rule.limit, Cost: t.cost})
	}
	out = s.decisions(len(takes))
	ok, o, err := p.table.Decide(now, s.reqs, out)
	p.count(o)
	return ok, out, err
}

// giveBack gives back everything the request took and still holds: its
// spends from leases and its local rules' tokens (a later check rejected
// it). It is called only by end, so each token is given back at most once;
// the held flags it clears are the record of what was taken.
func (c *httpContext) giveBack() {
	pl := &c.plan
	p := c.plugin
	now := p.now()
	spends := pl.spends[:0]
	for i := range pl.leased {
		if t := &pl.leased[i]; t.held {
			t.held = false
			spends = append(spends, lease.Spend{ID: t.id, Cost: t.cost})
		}
	}
	pl.spends = spends
	if len(spends) > 0 {
		p.leases.Refund(now, spends)
	}
	reqs := c.scratch.reqs[:0]
	for i := range pl.local {
		if t := &pl.local[i]; t.held {
			t.held = false
			reqs = append(reqs, store.Request{ID: t.id, Limit: t.rule.limit, Cost: t.cost})
		}
	}
	c.scratch.reqs = reqs
	if len(reqs) > 0 {
		p.metrics.refunds.Increment(uint64(p.table.Refund(now, reqs)))
	}
}

// rejecting is the rejection by the first take whose decision refused; nil
// when none did.
func rejecting(takes []take, out []bucket.Decision) *rejection {
	for i, t := range takes {
		if !out[i].Allowed {
			return &rejection{rule: t.rule, reason: reasonExceeded, d: out[i], id: t.id}
		}
	}
	return nil
}

// show makes ru's decision the one the response headers report if ru is the
// closest to its limit so far (the smallest fraction of its burst left).
func (c *httpContext) show(ru *rule, d bucket.Decision) {
	f := float64(d.Remaining) / ru.limit.Burst
	if c.shown == nil || f < c.shownLeft {
		c.shown, c.decision, c.shownLeft = ru, d, f
	}
}

// shadowRejected counts a shadow rule's would-be rejection and logs it at
// most once a second per rule.
func (c *httpContext) shadowRejected(ru *rule) {
	ru.shadowRej.Increment(1)
	if n, ok := ru.shadowLog.allow(c.plugin.now()); ok {
		proxywasm.LogInfo(Name + ": shadow rule " + strconv.Quote(ru.Name) + " would have rejected a request (" + strconv.Itoa(n) + " similar lines suppressed)")
	}
}

// identity is the bucket of ru for this request: the hash of the rule and
// its key values, and for a cluster rule also the bucket's name in the limit
// service (see clusterKey), both from one read of each value. present is
// false when a key has no value; id and key are then the rule's one bucket
// for all such requests (what missing_key "shared" uses).
func identity(ru *rule, r *request) (id uint64, key string, present bool) {
	cluster := ru.Scope == config.ScopeCluster
	var mac hash.Hash // keyed cluster keys: see keyMAC
	if cluster && ru.Service != nil && ru.Service.KeySecret != "" {
		mac = keyMAC(ru)
	}
	lo, hi := ru.identity, ru.identity.byte(0x5c)
	present = true
	for _, k := range ru.LimitKeys {
		v, has := r.value(k)
		if !has {
			lo, hi, present = ru.identity.byte(0xff), ru.identity.byte(0x5c).byte(0xff), false
			break
		}
		lo = lo.field(v)
		if cluster {
			hi = hi.field(v)
			if mac != nil {
				macField(mac, v)
			}
		}
	}
	switch {
	case cluster && mac != nil && present:
		key = keyedClusterKey(ru.Name, mac)
	case cluster:
		key = clusterKey(ru.Name, lo.sum(), hi.sum())
	}
	return lo.sum(), key, present
}
