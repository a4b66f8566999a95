package config

import (
	"slices"

	"github.com/tidwall/gjson"
)

// Algorithm is a rule's "algorithm": token_bucket (the default of the
// zero value: Limit and Cost), concurrency (Concurrency) or quota (Limit
// with its Calendar, and Cost).
type Algorithm int

const (
	AlgorithmTokenBucket Algorithm = iota
	AlgorithmConcurrency
	AlgorithmQuota
)

var algorithmNames = []string{"token_bucket", "concurrency", "quota"}

func (a Algorithm) String() string { return enumName(algorithmNames, int(a), "Algorithm") }

// Bounds and defaults of a concurrency rule's algorithm_config.
const (
	// MaxMaxInFlight bounds max_in_flight: the slots of one key.
	MaxMaxInFlight = 1_000_000
	// DefaultSlotTTLMS is ttl_ms's default, and MinSlotTTLMS and
	// MaxSlotTTLMS its bounds: how long a slot the limit service holds for
	// a cluster rule lives without a renewal (only with scope "cluster").
	DefaultSlotTTLMS = 30_000
	MinSlotTTLMS     = 1_000
	MaxSlotTTLMS     = 600_000
)

// Concurrency is a concurrency rule's algorithm_config: at most MaxInFlight
// requests of one key in flight at once. A request takes a slot when it is
// admitted and gives it back once, when its stream ends.
type Concurrency struct {
	MaxInFlight int
	// TTLMS is, for scope "cluster", how long the limit service keeps a
	// slot without a renewal; 0 for scope "local".
	TTLMS int
}

// tokenBucketFields are the algorithm_config fields of a token bucket,
// refused on a concurrency rule with a reason rather than as unknown.
var tokenBucketFields = []string{"tokens_per_second", "rps", "burst", "cost_source", "fixed_cost",
	"default_cost", "truncated_cost", "max_body_bytes"}

// parseConcurrency parses a concurrency rule's algorithm_config. Its slots
// are a bucket that never refills: Limit{TokensPerSecond: 0, Burst:
// max_in_flight}, each request costing one.
func parseConcurrency(path string, v gjson.Result) (Concurrency, Limit, Cost, error) {
	var cc Concurrency
	var l Limit
	c := Cost{Source: Source{Kind: SourceFixed}, Fixed: 1, Default: 1}
	ms, err := members(path, v)
	if err != nil {
		return cc, l, c, err
	}
	for _, m := range ms {
		if slices.Contains(tokenBucketFields, m.key) {
			return cc, l, c, errorf(m.at, "not allowed with algorithm \"concurrency\" (a request takes one slot; max_in_flight is the limit)")
		}
	}
	o, err := fields(path, v, "max_in_flight", "max_delay_ms", "max_waiting", "ttl_ms")
	if err != nil {
		return cc, l, c, err
	}
	if _, ok := o.get("max_in_flight"); !ok {
		return cc, l, c, errorf(path+".max_in_flight", "required")
	}
	if cc.MaxInFlight, err = o.integer("max_in_flight", 0, 1, MaxMaxInFlight); err != nil {
		return cc, l, c, err
	}
	if l.MaxDelayMS, err = o.integer("max_delay_ms", 0, 0, MaxDelayMS); err != nil {
		return cc, l, c, err
	}
	if _, ok := o.get("max_waiting"); ok && l.MaxDelayMS == 0 {
		return cc, l, c, errorf(path+".max_waiting", "only with max_delay_ms > 0 (a rule that never holds a request has nothing waiting)")
	}
	if l.MaxDelayMS > 0 {
		if l.MaxWaiting, err = o.integer("max_waiting", DefaultMaxWaiting, 1, MaxMaxWaiting); err != nil {
			return cc, l, c, err
		}
	}
	l.Burst = float64(cc.MaxInFlight)
	return cc, l, c, nil
}

// checkConcurrency checks what a concurrency rule allows once its scope is
// known: ttl_ms only with scope "cluster" (defaulted there), no charge_on
// and no sync "lease" (a slot is not a token to spend locally).
func checkConcurrency(path string, o object, cv gjson.Result, r *Rule) error {
	if r.Algorithm != AlgorithmConcurrency {
		return nil
	}
	if _, ok := o.get("charge_on"); ok {
		return errorf(path+".charge_on", "not allowed with algorithm \"concurrency\" (a slot is given back when the stream ends, whatever its status)")
	}
	if _, ok := o.get("sync"); ok {
		return errorf(path+".sync", "not allowed with algorithm \"concurrency\" (a cluster rule's slots are leases of their own, ttl_ms)")
	}
	co, err := fields(path+".algorithm_config", cv, "max_in_flight", "max_delay_ms", "max_waiting", "ttl_ms")
	if err != nil {
		return err
	}
	if _, ok := co.get("ttl_ms"); ok && r.Scope != ScopeCluster {
		return errorf(path+".algorithm_config.ttl_ms", "only allowed with scope \"cluster\"")
	}
	if r.Scope == ScopeCluster {
		if r.Concurrency.TTLMS, err = co.integer("ttl_ms", DefaultSlotTTLMS, MinSlotTTLMS, MaxSlotTTLMS); err != nil {
			return err
		}
	}
	return nil
}
