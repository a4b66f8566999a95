package engine

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// Concurrency rules of scope "cluster": the limit service holds the slots
// (service/slots.go, the contract in wire/slots.go), each a lease with the
// rule's ttl_ms that this Plugin renews while its request runs.
//
// Model: a request's enforced cluster concurrency rules take their slots
// in one acquire call (POST <service path's directory>/slots/acquire), all
// or none, after the request's leased rules and before its per-request
// cluster rules, so a refusal by those gives back slots (a release always
// lands or ends with its lease) rather than tokens. The slot id is drawn
// per request (a random 64-bit seed per Plugin and a counter); the service
// prefixes the caller's name. The Plugin records the id before the
// call goes out, so Done releases it (one plugin-owned release call,
// POST .../slots/release) however the stream ended, even while the answer
// was still on its way: a release of a slot never taken is answered
// "lost", harmless. Tick renews the slots acquired (POST .../slots/renew,
// batched per service and ttl, up to wire.MaxSlotBatch a call) once at
// least a third of the ttl minus a tick has passed since the last
// renewal, so a slot is renewed at least every ttl/3 + 1 s and never
// expires while its request runs, unless its renewals fail for about two
// thirds of the ttl. A slot a renewal finds lost (and cannot take back) is
// counted in cluster_slots_lost; its request runs on.
//
// Failure: a failed or malformed acquire follows the rule's failure_mode
// ("allow": the request goes on without slots, counted in failed_open;
// "deny": refused with limit_service_unavailable).
//
// Shadow: the shadow cluster concurrency rules take their slots in an
// acquire of their own, after the enforced one (so a shadow rule never
// makes an enforced rule's acquire fail), which the request waits for too.
// A refusal counts shadow_rejected (against the rules at their limit) and
// holds nothing; a failed call counts in service_errors only (no
// failure_mode); granted slots are held, renewed and released as enforced
// ones are, and show no headers.
//
// Waiting: an enforced rule with max_delay_ms whose acquire is refused
// tries the whole acquire again 50 to 100 ms later until its bound
// (retryClusterSlots), within max_waiting requests per rule and worker
// (claimed in planRules); there is no order across the fleet.
//
// Bound: the service never has more than max_in_flight slots out per key;
// a Plugin that vanishes leaves its slots out until their lease ends (at
// most ttl_ms after their last renewal). A release that races ahead of its
// own acquire (the client reset while the acquire was in flight) finds
// nothing, and the slot then stays out until its lease ends (ttl_ms).

// slotState is where a request's cluster slots stand.
type slotState uint8

const (
	slotsPending  slotState = iota // the acquire is on its way
	slotsAcquired                  // held: renewed by Tick, released at Done
)

// openSlots is one request's cluster slots, as the Plugin renews and
// releases them.
type openSlots struct {
	service   *config.Service
	ttlMS     int
	slots     []wire.Slot
	state     slotState
	renewedAt int64 // Unix ns of the acquire or the last renewal sent
}

// clusterSlots is a Plugin's record of its requests' cluster slots. It is
// used by one worker's thread only, like the rest of the Plugin.
type clusterSlots struct {
	seed, next uint64
	open       map[string]*openSlots
	calls      Counter // acquire, renew and release calls sent
	lost       Counter // slots a renewal found lost
}

// configureClusterSlots defines the cluster slots' metrics and draws the
// seed of the slot ids: random (the Go runtime's source, seeded by the host
// for each Wasm VM and each process), so Plugins configured at the same
// moment, in one Envoy or in two, draw different ids.
func (p *Plugin) configureClusterSlots() {
	p.cslots = clusterSlots{
		seed: rand.Uint64() ^ mix(uint64(p.host.Now())),
		// slot calls sent to the limit service: acquire, renew, release
		calls: p.host.Counter(Name + ".cluster_slot_calls"),
		// cluster slots a renewal found lost (expired, or lost by the
		// service's store) and could not take again
		lost: p.host.Counter(Name + ".cluster_slots_lost"),
	}
}

// newSlotID draws a slot id: 16 hex digits of the seed, a dash, the count.
func (s *clusterSlots) newID() string {
	s.next++
	b := make([]byte, 0, 34)
	b = appendHex(b, s.seed)
	b = append(b, '-')
	return string(strconv.AppendUint(b, s.next, 16))
}

// slotsPath is the path of a slot call (op: acquire, renew, release) on
// service s: beside its decide path (/v1/decide: /v1/slots/acquire).
func slotsPath(s *config.Service, op string) string {
	dir := "/v1"
	if i := strings.LastIndexByte(s.Path, '/'); i > 0 {
		dir = s.Path[:i]
	}
	return dir + "/slots/" + op
}

// slotsOf are the request's enforced or shadow cluster concurrency rules,
// and where the id of their slots is kept.
func (c *Request) slotsOf(shadow bool) ([]take, *string) {
	if shadow {
		return c.plan.shadowSlotsC, &c.plan.shadowSlotID
	}
	return c.plan.slotsC, &c.plan.slotID
}

// acquireSlots sends the acquire call of the request's enforced (or, in a
// call of their own, shadow) cluster concurrency rules; the request waits
// for its answer.
func (c *Request) acquireSlots(shadow bool) (*rejection, bool) {
	p := c.plugin
	takes, slotID := c.slotsOf(shadow)
	if p.cslots.open == nil {
		p.cslots.open = map[string]*openSlots{}
	}
	id := p.cslots.newID()
	req := &wire.AcquireRequest{ID: id, Keys: make([]wire.SlotKey, len(takes))}
	os := &openSlots{service: takes[0].rule.Service, slots: make([]wire.Slot, len(takes)), renewedAt: p.now()}
	for i, t := range takes {
		max := int64(t.rule.Concurrency.MaxInFlight)
		req.Keys[i] = wire.SlotKey{Key: t.key, MaxInFlight: max}
		os.slots[i] = wire.Slot{Key: t.key, MaxInFlight: max, ID: id}
		if ttl := t.rule.Concurrency.TTLMS; os.ttlMS == 0 || ttl < os.ttlMS {
			os.ttlMS = ttl
		}
	}
	req.TTLMs = int64(os.ttlMS)
	*slotID = id
	p.cslots.open[id] = os
	p.cslots.calls.Increment(1)
	s := os.service
	err := postWithin(c.stream, s, slotsPath(s, "acquire"), wire.AppendAcquireRequest(nil, req), s.TimeoutMS,
		func(a *Answer) { c.onSlots(req, a, shadow) })
	if err != nil {
		delete(p.cslots.open, id)
		*slotID = ""
		return c.slotsFailed(takes, "dispatching the slot call: "+err.Error()), false
	}
	return nil, true
}

// onSlots applies the acquire's answer to the paused request and goes on
// with its decision. A shadow acquire's refusal is counted in
// shadow_rejected, and the request goes on holding nothing.
func (c *Request) onSlots(req *wire.AcquireRequest, a *Answer, shadow bool) {
	p := c.plugin
	takes, slotID := c.slotsOf(shadow)
	raw, why := answerBody(a)
	var ans *wire.AcquireAnswer
	if why == "" {
		var err error
		if ans, err = wire.DecodeAcquireAnswer(raw, req); err != nil {
			why = "malformed response body: " + err.Error()
		}
	}
	if !c.waiting() || *slotID != req.ID {
		if why != "" {
			p.serviceFailed(takes, why)
		}
		return // Done releases the slots (or did)
	}
	if why != "" {
		c.next(c.slotsFailed(takes, why))
		return
	}
	if !ans.Acquired {
		delete(p.cslots.open, req.ID) // nothing taken
		*slotID = ""
		if shadow { // counted against the rules at their limit (or the first)
			n := 0
			for i, t := range takes {
				if ans.InFlight[i] >= req.Keys[i].MaxInFlight {
					p.shadowRejected(t.rule)
					n++
				}
			}
			if n == 0 {
				p.shadowRejected(takes[0].rule)
			}
			c.next(nil)
			return
		}
		refusing := &takes[0] // refused with room everywhere: a table filled meanwhile
		for i := range takes {
			if ans.InFlight[i] >= req.Keys[i].MaxInFlight {
				refusing = &takes[i]
				break
			}
		}
		if c.retryClusterSlots(refusing) {
			return // paused until the retry
		}
		if c.cslotWaited && refusing.rule.delayRefused != nil {
			refusing.rule.delayRefused.Increment(1)
		}
		c.next(&rejection{rule: refusing.rule, reason: reasonConcurrency, d: slotDecision(bucket.Decision{})})
		return
	}
	if c.cslotWaited && !shadow {
		c.heldFor = max(p.now()-c.plan.now, 1)
		for i := range takes {
			if t := &takes[i]; t.maxWait > 0 {
				t.rule.delayed.Increment(1)
				t.rule.delayMs.Increment(uint64((c.heldFor + 999_999) / 1e6))
			}
		}
	}
	if os := p.cslots.open[req.ID]; os != nil {
		os.state = slotsAcquired
	}
	for i := range takes {
		t := &takes[i]
		t.held = true
		t.rule.allowed.Increment(1)
		t.rule.inFlight.Add(1)
		d := slotDecision(bucket.Decision{Allowed: true, Remaining: req.Keys[i].MaxInFlight - ans.InFlight[i]})
		t.d = d
		if !shadow { // a shadow rule shows nothing to the client
			c.show(t.rule, d)
		}
	}
	c.next(nil)
}

// clusterSlotRetry is the least time between a waiting request's acquire
// calls; each retry comes after it plus a jitter of up to as much again.
const clusterSlotRetry = 50 * int64(time.Millisecond)

// retryClusterSlots reports whether the request refused by take t waits
// for a cluster slot instead (and then it stays paused): t's rule has
// max_delay_ms and the request claimed one of its max_waiting places
// (planRules). It sends the whole acquire again 50 to 100 ms later (the
// jitter spreads the fleet's waiters), the last try at its bound. There is
// no line across the fleet: whichever waiter's acquire reaches the limit
// service first after a slot frees takes it.
func (c *Request) retryClusterSlots(t *take) bool {
	if t.maxWait == 0 || !t.claim {
		if t.full {
			t.rule.waitingFull.Increment(1)
		}
		return false
	}
	left := c.plan.now + t.maxWait - c.plugin.now()
	if left <= 0 {
		return false
	}
	delay := min(clusterSlotRetry+rand.Int64N(clusterSlotRetry+1), left)
	gen := c.gen
	err := c.stream.After(delay, func() {
		if c.gen == gen && c.waiting() && c.step == stepShadowSlots {
			c.step = stepSlots
			c.next(nil)
		}
	})
	if err != nil {
		return false // no timer: refused now
	}
	c.cslotWaited = true
	return true
}

// slotsFailed counts and logs a failed acquire and applies the first
// rule's failure_mode: "allow" lets the request through without slots.
// Shadow rules apply none: the request goes on.
func (c *Request) slotsFailed(takes []take, why string) *rejection {
	c.plugin.serviceFailed(takes, why)
	if takes[0].rule.Mode == config.ModeShadow {
		return nil
	}
	return failureMode(takes[0].rule, func() {
		for _, t := range takes {
			t.rule.failedOpen.Increment(1)
		}
	})
}

// releaseClusterSlots gives back the request's cluster slots, enforced
// and shadow, once: an id is forgotten as its release goes out. Done and a
// refusal call it.
func (c *Request) releaseClusterSlots() {
	c.releaseSlotsOf(false)
	c.releaseSlotsOf(true)
}

func (c *Request) releaseSlotsOf(shadow bool) {
	takes, slotID := c.slotsOf(shadow)
	id := *slotID
	if id == "" {
		return
	}
	*slotID = ""
	p := c.plugin
	os := p.cslots.open[id]
	delete(p.cslots.open, id)
	for i := range takes {
		if t := &takes[i]; t.held {
			t.held = false
			t.rule.inFlight.Add(-1)
		}
	}
	if os == nil {
		return
	}
	p.sendSlots(os.service, "release", &wire.SlotsRequest{Slots: os.slots})
}

// sendSlots sends a renew or release call the Plugin owns, counting what
// its answer says was lost (a renewal) and its failures.
func (p *Plugin) sendSlots(s *config.Service, op string, req *wire.SlotsRequest) {
	renew := op == "renew"
	p.cslots.calls.Increment(1)
	err := postWithin(p.host, s, slotsPath(s, op), wire.AppendSlotsRequest(nil, req), s.TimeoutMS, func(a *Answer) {
		raw, why := answerBody(a)
		if why == "" {
			ans, err := wire.DecodeSlotsAnswer(raw, req, renew)
			if err != nil {
				why = "malformed response body: " + err.Error()
			} else if renew {
				for _, st := range ans.Slots {
					if st == wire.SlotLost {
						p.cslots.lost.Increment(1)
					}
				}
			}
		}
		if why != "" {
			p.slotCallFailed(s, op, why)
		}
	})
	if err != nil {
		p.slotCallFailed(s, op, "dispatching the call: "+err.Error())
	}
}

// slotCallFailed counts and logs (rate-limited) a failed renew or release:
// its slots end with their lease.
func (p *Plugin) slotCallFailed(s *config.Service, op, why string) {
	p.metrics.serviceErrors.Increment(1)
	p.warn(&p.serviceLog, "limit service "+s.Cluster+": slot "+op+": "+why+" (the slots end with their ttl_ms)")
}

// tickMS is the period of Plugin.Tick.
const tickMS = 1000

// renewSlots sends, per service and ttl, the renewals of the acquired
// slots whose last renewal is at least a third of their ttl, less a tick,
// old (Tick).
func (p *Plugin) renewSlots() {
	now := p.now()
	type batchKey struct {
		s   *config.Service
		ttl int
	}
	var batches map[batchKey]*wire.SlotsRequest
	for _, os := range p.cslots.open {
		if os.state != slotsAcquired || now-os.renewedAt < int64(os.ttlMS/3-tickMS)*1e6 {
			continue
		}
		os.renewedAt = now
		k := batchKey{os.service, os.ttlMS}
		if batches == nil {
			batches = map[batchKey]*wire.SlotsRequest{}
		}
		b := batches[k]
		if b == nil || len(b.Slots)+len(os.slots) > wire.MaxSlotBatch {
			if b != nil {
				p.sendSlots(k.s, "renew", b)
			}
			b = &wire.SlotsRequest{TTLMs: int64(k.ttl)}
			batches[k] = b
		}
		b.Slots = append(b.Slots, os.slots...)
	}
	for k, b := range batches {
		p.sendSlots(k.s, "renew", b)
	}
}

// checkClusterSlots refuses what the cluster path does not support: a
// max_in_flight above what the limit service holds (wire.MaxInFlight).
func checkClusterSlots(cfg *config.Config) error {
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		if r.Algorithm != config.AlgorithmConcurrency || r.Scope != config.ScopeCluster {
			continue
		}
		if r.Concurrency.MaxInFlight > wire.MaxInFlight {
			at := "rules[" + strconv.Itoa(i) + "]"
			return &config.Error{Path: at + ".algorithm_config.max_in_flight", Err: errClusterMaxInFlight}
		}
	}
	return nil
}

var (
	errClusterMaxInFlight = errorString("must be <= " + strconv.Itoa(wire.MaxInFlight) + " with scope \"cluster\" (the limit service's bound)")
)

type errorString string

func (e errorString) Error() string { return string(e) }
