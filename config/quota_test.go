package config

import (
	"os"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/calendar"
)

// quotaRule is a rule named r with algorithm quota and the given
// algorithm_config fields.
func quotaRule(fields string) string {
	return `{"name":"r","algorithm":"quota","algorithm_config":{` + fields + `}}`
}

func init() {
	badCases = append(badCases, quotaBadCases...)
	goodCases = append(goodCases, quotaGoodCases...)
}

var quotaBadCases = []badCase{
	{name: "quota without limit", in: doc("", quotaRule(`"period":"day"`)), want: `config: rules[0].algorithm_config.limit: required: what one period holds`},
	{name: "quota limit zero", in: doc("", quotaRule(`"limit":0,"period":"day"`)), want: `config: rules[0].algorithm_config.limit: must be > 0, got 0`},
	{name: "quota limit too large", in: doc("", quotaRule(`"limit":1e13,"period":"day"`)), want: `config: rules[0].algorithm_config.limit: must be at most 1000000000000, got 1e13`},
	{name: "quota without period", in: doc("", quotaRule(`"limit":10`)), want: `config: rules[0].algorithm_config.period: required: minute, hour, day, week, month, quarter or year`},
	{name: "quota unknown period", in: doc("", quotaRule(`"limit":10,"period":"fortnight"`)), want: `config: rules[0].algorithm_config.period: must be one of minute, hour, day, week, month, quarter, year, got "fortnight"`},
	{name: "quota period not a string", in: doc("", quotaRule(`"limit":10,"period":7`)), want: `config: rules[0].algorithm_config.period: must be a string, got number`},
	{name: "quota unknown zone", in: doc("", quotaRule(`"limit":10,"period":"day","time_zone":"Mars/Olympus"`)), want: `config: rules[0].algorithm_config.time_zone: "Mars/Olympus" is not an IANA time zone name in Go's zone database`, gap: gapZone},
	{name: "quota Local zone", in: doc("", quotaRule(`"limit":10,"period":"day","time_zone":"Local"`)), want: `config: rules[0].algorithm_config.time_zone: "Local" depends on the host; name an IANA zone such as "Europe/Paris"`},
	{name: "quota empty zone", in: doc("", quotaRule(`"limit":10,"period":"day","time_zone":""`)), want: `config: rules[0].algorithm_config.time_zone: must not be empty (leave it out for the default)`},
	{name: "quota week_start upper case", in: doc("", quotaRule(`"limit":10,"period":"week","week_start":"Sunday"`)), want: `config: rules[0].algorithm_config.week_start: must be a weekday's name in lower case (monday to sunday), got "Sunday"`},
	{name: "quota anchor with offset", in: doc("", quotaRule(`"limit":10,"period":"month","anchor":"2026-01-31T00:00:00Z"`)), want: `config: rules[0].algorithm_config.anchor: must be a local date-time 2006-01-02T15:04:05 (or a date 2006-01-02) with no offset, a year from 1, got "2026-01-31T00:00:00Z"`},
	{name: "quota anchor not a date", in: doc("", quotaRule(`"limit":10,"period":"month","anchor":"2026-02-30"`)), want: `config: rules[0].algorithm_config.anchor: must be a local date-time 2006-01-02T15:04:05 (or a date 2006-01-02) with no offset, a year from 1, got "2026-02-30"`, gap: gapDate},
	{name: "quota week_start against anchor", in: doc("", quotaRule(`"limit":10,"period":"week","week_start":"monday","anchor":"2026-01-01"`)), want: `config: rules[0].algorithm_config.week_start: monday disagrees with the anchor 2026-01-01, a thursday (an anchor sets the day weeks start on)`, gap: gapDate},
	{name: "quota with tokens_per_second", in: doc("", quotaRule(`"limit":10,"period":"day","tokens_per_second":1`)), want: `config: rules[0].algorithm_config.tokens_per_second: not a quota's field: a quota has no refill rate: its limit is spent over each period and full again at the next boundary (use limit and period)`},
	{name: "quota with rps", in: doc("", quotaRule(`"rps":1,"limit":10,"period":"day"`)), want: `config: rules[0].algorithm_config.rps: not a quota's field: a quota has no refill rate: its limit is spent over each period and full again at the next boundary (use limit and period)`},
	{name: "quota with burst", in: doc("", quotaRule(`"limit":10,"period":"day","burst":10`)), want: `config: rules[0].algorithm_config.burst: not a quota's field: a quota has no burst: limit is what one period holds`},
	{name: "quota with max_delay_ms", in: doc("", quotaRule(`"limit":10,"period":"day","max_delay_ms":100`)), want: `config: rules[0].algorithm_config.max_delay_ms: not a quota's field: a quota refills only at its boundary, so a request short of it is refused at once with Retry-After to the boundary`},
	{name: "quota unknown field", in: doc("", quotaRule(`"limit":10,"period":"day","refill":1`)), want: `config: rules[0].algorithm_config.refill: unknown field`},
	{name: "quota repeated field", in: doc("", quotaRule(`"limit":10,"period":"day","limit":11`)), want: `config: rules[0].algorithm_config.limit: duplicate field`, gap: gapDuplicate},
	{name: "quota fixed_cost above limit", in: doc("", quotaRule(`"limit":10,"period":"day","fixed_cost":11`)), want: `config: rules[0].algorithm_config.fixed_cost: must be <= limit (10), got 11: such a request could never pass`, gap: gapRelation},
	{name: "quota max_body_bytes without response_json", in: doc("", quotaRule(`"limit":10,"period":"day","max_body_bytes":10`)), want: `config: rules[0].algorithm_config.max_body_bytes: only with cost_source response_json:<path> (the only cost read from a body)`},
	{name: "quota cluster limit above the service's bound", in: doc(svc, `{"name":"r","scope":"cluster","algorithm":"quota","algorithm_config":{"limit":2e9,"period":"month"}}`), want: `config: rules[0].algorithm_config.limit: must be at most 1000000000 for a cluster rule (the limit service's bound), got 2000000000`, gap: gapCluster},
}

const (
	gapZone    = "the IANA zone names are Go's zone database, not listed in the schema"
	gapDate    = "whether a date exists, and its weekday, are not expressible"
	gapCluster = "the limit service's bound on a cluster rule's limit is not expressed for quotas"
)

var quotaGoodCases = []goodCase{
	{
		name: "a monthly quota in New York, anchored on the 31st, cost from the response",
		in: doc("", `{"name":"monthly","limit_keys":["header:x-tenant"],"algorithm":"quota","status":403,
			"algorithm_config":{"limit":1000000,"period":"month","time_zone":"America/New_York",
			"anchor":"2026-01-31T00:00:00","cost_source":"response_json:usage.total_tokens"}}`),
		want: wantConfig(func() Rule {
			r := wantRule("monthly")
			r.LimitKeys = []Source{{Kind: SourceHeader, Name: "x-tenant"}}
			loc, _ := time.LoadLocation("America/New_York")
			r.Limit = Limit{Burst: 1e6, Calendar: calendar.Spec{Period: calendar.Month, Location: loc, WeekStart: time.Monday,
				Anchor: calendar.DateTime{Year: 2026, Month: time.January, Day: 31}}}
			r.Cost = Cost{Source: Source{Kind: SourceResponseJSON, Name: "usage.total_tokens"}, Fixed: 1, Default: 1,
				Truncated: 1e6, MaxBodyBytes: DefaultMaxBodyBytes}
			r.Status = 403
			return r
		}()),
	},
	{
		name: "a daily quota stacked with a token bucket, defaults UTC and monday, a cluster hourly quota",
		in: doc(svc, `{"name":"rate","algorithm":"token_bucket","algorithm_config":{"tokens_per_second":10,"burst":50}}`,
			`{"name":"daily","algorithm":"quota","algorithm_config":{"limit":5000,"period":"day","fixed_cost":2}}`,
			`{"name":"weekly","algorithm":"quota","algorithm_config":{"limit":5,"period":"week","week_start":"sunday"}}`,
			`{"name":"hourly","scope":"cluster","sync":"lease","algorithm":"quota","algorithm_config":{"limit":100,"period":"hour","time_zone":"Asia/Kathmandu"}}`),
		also: func(t *testing.T, c *Config) {
			d, w, h := c.Rules[1].Limit, c.Rules[2].Limit, c.Rules[3].Limit
			if c.Rules[0].Limit.Quota() || !d.Quota() || d.Calendar.Period != calendar.Day || d.Calendar.Location != time.UTC ||
				d.Calendar.WeekStart != time.Monday || d.Burst != 5000 || c.Rules[1].Cost.Fixed != 2 {
				t.Errorf("daily = %+v, %+v", d, c.Rules[1].Cost)
			}
			if w.Calendar.WeekStart != time.Sunday {
				t.Errorf("weekly = %+v", w)
			}
			if h.Calendar.Period != calendar.Hour || h.Calendar.Location.String() != "Asia/Kathmandu" || c.Rules[3].Scope != ScopeCluster ||
				c.Rules[3].Sync != SyncLease {
				t.Errorf("hourly = %+v", c.Rules[3])
			}
		},
	},
}

// TestQuotaWindow: the Spec Parse returns is the calendar's: an hour in
// Kathmandu turns at hh:15 UTC.
func TestQuotaWindow(t *testing.T) {
	c, err := Parse([]byte(doc("", quotaRule(`"limit":3,"period":"hour","time_zone":"Asia/Kathmandu"`))))
	if err != nil {
		t.Fatal(err)
	}
	start, end := c.Rules[0].Limit.Calendar.Window(time.Date(2026, 6, 1, 10, 20, 0, 0, time.UTC))
	if !start.Equal(time.Date(2026, 6, 1, 10, 15, 0, 0, time.UTC)) || end.Sub(start) != time.Hour {
		t.Fatalf("Window = [%v, %v)", start, end)
	}
}

// TestQuotaSchemaBounds: the schema states Parse's bound on a quota's limit.
func TestQuotaSchemaBounds(t *testing.T) {
	data, err := os.ReadFile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if v := gjson.GetBytes(data, `\$defs.quota_config.properties.limit.maximum`); v.Float() != MaxBurst {
		t.Errorf("schema quota_config.limit.maximum = %s, want %v", v.Raw, MaxBurst)
	}
}
