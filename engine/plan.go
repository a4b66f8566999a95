package engine

import (
	"math"
	"strconv"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
)

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
	// period is a leased quota's period when held (lease.Spend.Period): a
	// refund goes back only to a lease of that period.
	period int64
	// amount is the adjustment the response asks for: the real cost less
	// cost, or −cost for a status charge_on does not list.
	amount float64
	// maxWait is how long the request may be held for this take's tokens
	// (the rule's max_delay_ms; 0 when the rule holds none, or when its
	// max_waiting places are taken already: full). claim: the take holds
	// one of those places (rule.claimed) until the request goes on, is
	// refused or ends (Request.releaseClaims).
	maxWait int64
	full    bool
	claim   bool
	// prices is the request's model's row of the rule's price table
	// (money.go); nil for a rule without one, or a model with no price.
	prices []uint64
}

// plan is one request's decision in the making. It lives on the Request
// because a cluster rule's answer arrives in a later callback.
type plan struct {
	now                  int64
	local, cluster       []take // enforced rules (cluster: sync per_request)
	leased               []take // enforced cluster rules with sync lease
	shadowLocal, shadowC []take // shadow rules, decided on their own
	// charges: some take's rule settles with the response (a cost known
	// from the response, or charge_on).
	charges bool
	// slots: a take is a concurrency rule's slot, which Done gives back.
	slots bool
	// slotsC are the enforced cluster concurrency rules, and slotID the
	// id of their slots in the limit service (concurrency_cluster.go);
	// shadowSlotsC and shadowSlotID the same of the shadow ones, acquired
	// in a call of their own.
	slotsC, shadowSlotsC []take
	slotID, shadowSlotID string
	buf                  [4]take // backing for the usual handful of takes
}

// planRules walks the rules once and fills c.plan with the buckets the
// request takes; it stops at a rule that rejects the request outright
// (missing_key "deny", a cost above the burst).
//
// Tiers: among rules of one group, the first member that applies counts. A
// member applies when it matches and is an allow rule, or yields a bucket
// (its keys are present, or missing_key is "shared"), or rejects for
// missing_key "deny"; one that matches but lacks a key with "skip" does not
// apply, and the next member is tried.
func (c *Request) planRules(r *requestValues) *rejection {
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
					c.plugin.shadowRejected(ru)
					continue
				}
				return &rejection{rule: ru, reason: reasonMissingKey}
			}
			// MissingShared: id is the rule's one bucket for such requests.
		}
		if ru.Group != "" {
			claimed = append(claimed, ru.Group)
		}
		if !p.keyed && (ru.Scope == config.ScopeLocal || ru.Sync == config.SyncLease) {
			// No identity without the key (shared data failed): fail open.
			ru.failedOpen.Increment(1)
			continue
		}
		t := take{rule: ru, id: id, key: key, cost: requestCost(ru, r)}
		if ru.Cost.Money != nil {
			t.prices, t.cost = moneyReserve(ru, r)
		}
		if t.cost > ru.limit.Burst {
			if ru.Mode == config.ModeShadow {
				c.plugin.shadowRejected(ru)
				continue
			}
			return &rejection{rule: ru, reason: reasonCostTooHigh}
		}
		if ru.maxWait > 0 {
			// A place of max_waiting is claimed here, when the wait is
			// asked for, not when the request is held: between the two a
			// call may run (a cluster rule's answer, a lease), and the
			// requests decided meanwhile must count this one.
			t.maxWait, t.full = ru.maxWait, ru.claimed >= ru.Limit.MaxWaiting
			switch {
			case t.full:
				t.maxWait = 0
			case ru.Mode != config.ModeShadow: // a shadow rule never holds
				t.claim = true
				ru.claimed++
			}
		}
		pl := &c.plan
		pl.charges = pl.charges || ru.charges
		pl.slots = pl.slots || ru.slots
		switch cluster := ru.Scope == config.ScopeCluster; {
		case ru.Mode == config.ModeShadow && cluster && ru.slots:
			pl.shadowSlotsC = append(pl.shadowSlotsC, t)
		case ru.Mode == config.ModeShadow && cluster:
			pl.shadowC = append(pl.shadowC, t)
		case ru.Mode == config.ModeShadow:
			pl.shadowLocal = append(pl.shadowLocal, t)
		case cluster && ru.slots:
			pl.slotsC = append(pl.slotsC, t)
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

// requestCost is the tokens a request takes: the fixed cost, or the header
// or query value. A value that is absent, not a number, infinite or below
// config.MinCost (zero, negative, or as tiny as 1e-300) is not a cost:
// default_cost applies.
//
// A cost known only from the response reserves default_cost (response.go
// charges the difference).
func requestCost(ru *rule, r *requestValues) float64 {
	switch {
	case ru.Cost.Source.Kind == config.SourceFixed:
		return ru.Cost.Fixed
	case ru.Cost.FromResponse():
		return ru.Cost.Default
	}
	v, ok := r.value(ru.Cost.Source)
	if !ok {
		return ru.Cost.Default
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsInf(f, 0) || !(f >= config.MinCost) {
		return ru.Cost.Default
	}
	return f
}
