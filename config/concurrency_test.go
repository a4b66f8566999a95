package config

import "testing"

// conc is a concurrency rule named r whose algorithm_config holds fields,
// with extra rule fields.
func conc(extra, fields string) string {
	if extra != "" {
		extra += ","
	}
	return `{"name":"r",` + extra + `"algorithm":"concurrency","algorithm_config":{` + fields + `}}`
}

const concSvc = `"service":{"cluster":"limitd"}`

func TestParseConcurrency(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Rule
	}{
		{doc("", conc("", `"max_in_flight":4`)), Rule{Concurrency: Concurrency{MaxInFlight: 4}, Scope: ScopeLocal}},
		{doc(concSvc, conc(`"scope":"cluster"`, `"max_in_flight":1`)), Rule{Concurrency: Concurrency{MaxInFlight: 1, TTLMS: DefaultSlotTTLMS}, Scope: ScopeCluster}},
		{doc(concSvc, conc(`"scope":"cluster"`, `"max_in_flight":1000000,"ttl_ms":1000`)), Rule{Concurrency: Concurrency{MaxInFlight: MaxMaxInFlight, TTLMS: 1000}, Scope: ScopeCluster}},
		{doc("", conc("", `"max_in_flight":3,"max_delay_ms":500`)), Rule{Concurrency: Concurrency{MaxInFlight: 3}, Limit: Limit{MaxDelayMS: 500, MaxWaiting: DefaultMaxWaiting}}},
		{doc("", conc("", `"max_in_flight":3,"max_delay_ms":500,"max_waiting":9`)), Rule{Concurrency: Concurrency{MaxInFlight: 3}, Limit: Limit{MaxDelayMS: 500, MaxWaiting: 9}}},
	} {
		c, err := Parse([]byte(tt.in))
		if err != nil {
			t.Fatalf("Parse(%s): %v", tt.in, err)
		}
		r := c.Rules[0]
		if r.Algorithm != AlgorithmConcurrency || r.Concurrency != tt.want.Concurrency || r.Scope != tt.want.Scope {
			t.Errorf("Parse(%s): algorithm %v, %+v, scope %v; want concurrency, %+v, scope %v", tt.in, r.Algorithm, r.Concurrency, r.Scope, tt.want.Concurrency, tt.want.Scope)
		}
		// The slots are a bucket that never refills, a request costs one.
		if r.Limit != (Limit{Burst: float64(tt.want.Concurrency.MaxInFlight), MaxDelayMS: tt.want.Limit.MaxDelayMS, MaxWaiting: tt.want.Limit.MaxWaiting}) || r.Cost != (Cost{Source: Source{Kind: SourceFixed}, Fixed: 1, Default: 1}) {
			t.Errorf("Parse(%s): Limit %+v, Cost %+v", tt.in, r.Limit, r.Cost)
		}
		roundTrip(t, c)
	}
}

func TestParseConcurrencyErrors(t *testing.T) {
	sch := compileSchema(t)
	for _, tc := range []badCase{
		{name: "no max_in_flight", in: doc("", conc("", ``)), want: `config: rules[0].algorithm_config.max_in_flight: required`},
		{name: "max_in_flight 0", in: doc("", conc("", `"max_in_flight":0`)), want: `config: rules[0].algorithm_config.max_in_flight: must be between 1 and 1000000, got 0`},
		{name: "max_in_flight too big", in: doc("", conc("", `"max_in_flight":1000001`)), want: `config: rules[0].algorithm_config.max_in_flight: must be between 1 and 1000000, got 1000001`},
		{name: "max_in_flight fraction", in: doc("", conc("", `"max_in_flight":1.5`)), want: `config: rules[0].algorithm_config.max_in_flight: must be an integer, got 1.5`},
		{name: "burst", in: doc("", conc("", `"max_in_flight":2,"burst":2`)), want: `config: rules[0].algorithm_config.burst: not allowed with algorithm "concurrency" (a request takes one slot; max_in_flight is the limit)`},
		{name: "tokens_per_second", in: doc("", conc("", `"tokens_per_second":2,"max_in_flight":2`)), want: `config: rules[0].algorithm_config.tokens_per_second: not allowed with algorithm "concurrency" (a request takes one slot; max_in_flight is the limit)`},
		{name: "cost_source", in: doc("", conc("", `"max_in_flight":2,"cost_source":"header:x"`)), want: `config: rules[0].algorithm_config.cost_source: not allowed with algorithm "concurrency" (a request takes one slot; max_in_flight is the limit)`},
		{name: "unknown", in: doc("", conc("", `"max_in_flight":2,"slots":2`)), want: `config: rules[0].algorithm_config.slots: unknown field`},
		{name: "max_waiting without max_delay_ms", in: doc("", conc("", `"max_in_flight":2,"max_waiting":100`)), want: `config: rules[0].algorithm_config.max_waiting: only with max_delay_ms > 0 (a rule that never holds a request has nothing waiting)`, gap: gapRelation},
		{name: "max_delay_ms too long", in: doc("", conc("", `"max_in_flight":2,"max_delay_ms":60001`)), want: `config: rules[0].algorithm_config.max_delay_ms: must be between 0 and 60000, got 60001`},
		{name: "ttl_ms local", in: doc("", conc("", `"max_in_flight":2,"ttl_ms":5000`)), want: `config: rules[0].algorithm_config.ttl_ms: only allowed with scope "cluster"`},
		{name: "ttl_ms low", in: doc(concSvc, conc(`"scope":"cluster"`, `"max_in_flight":2,"ttl_ms":999`)), want: `config: rules[0].algorithm_config.ttl_ms: must be between 1000 and 600000, got 999`},
		{name: "charge_on", in: doc("", conc(`"charge_on":["2xx"]`, `"max_in_flight":2`)), want: `config: rules[0].charge_on: not allowed with algorithm "concurrency" (a slot is given back when the stream ends, whatever its status)`},
		{name: "sync", in: doc(concSvc, conc(`"scope":"cluster","sync":"lease"`, `"max_in_flight":2`)), want: `config: rules[0].sync: not allowed with algorithm "concurrency" (a cluster rule's slots are leases of their own, ttl_ms)`},
		{name: "token bucket fields missing", in: doc("", `{"name":"r","algorithm":"token_bucket","algorithm_config":{"max_in_flight":2}}`), want: `config: rules[0].algorithm_config.max_in_flight: unknown field`},
	} {
		_, err := Parse([]byte(tc.in))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: Parse(%s)\n got error %v\nwant error %s", tc.name, tc.in, err, tc.want)
		}
		if err := validate(sch, []byte(tc.in)); err == nil && tc.gap == "" {
			t.Errorf("%s: schema.json accepts %s", tc.name, tc.in)
		}
	}
}
