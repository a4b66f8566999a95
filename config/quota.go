package config

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/calendar"
)

// quotaFields are a quota's own fields of algorithm_config; its other
// fields are a token bucket's cost fields, read by parseAlgorithmConfig.
var quotaFields = []string{"limit", "period", "time_zone", "week_start", "anchor"}

// notQuotaFields are the token bucket's fields a quota refuses, and why.
var notQuotaFields = map[string]string{
	"tokens_per_second": "a quota has no refill rate: its limit is spent over each period and full again at the next boundary (use limit and period)",
	"rps":               "a quota has no refill rate: its limit is spent over each period and full again at the next boundary (use limit and period)",
	"burst":             "a quota has no burst: limit is what one period holds",
	"max_delay_ms":      "a quota refills only at its boundary, so a request short of it is refused at once with Retry-After to the boundary",
	"max_waiting":       "a quota refills only at its boundary, so a request short of it is refused at once with Retry-After to the boundary",
}

// parseQuota reads the algorithm_config of an "algorithm": "quota" rule: a
// limit spent over each calendar period. The Limit it returns has Burst =
// limit, TokensPerSecond 0 and the period in Calendar; the cost fields are
// a token bucket's, with limit as its burst.
func parseQuota(path string, v gjson.Result) (Limit, Cost, error) {
	var l Limit
	ms, err := members(path, v)
	if err != nil {
		return l, Cost{}, err
	}
	o := object{path: path, fields: make(map[string]gjson.Result, len(ms))}
	var rest []member
	for _, m := range ms {
		if why, refused := notQuotaFields[m.key]; refused {
			return l, Cost{}, errorf(m.at, "not a quota's field: "+why)
		}
		if !contains(quotaFields, m.key) {
			rest = append(rest, m)
			continue
		}
		o.fields[m.key] = m.value
		o.order = append(o.order, m.key)
	}
	if _, ok := o.get("limit"); !ok {
		return l, Cost{}, errorf(path+".limit", "required: what one period holds")
	}
	if l.Burst, err = o.positive("limit", MaxBurst); err != nil {
		return l, Cost{}, err
	}
	if _, ok := o.get("period"); !ok {
		return l, Cost{}, errorf(path+".period", "required: minute, hour, day, week, month, quarter or year")
	}
	var text [4]string
	for i, name := range quotaFields[1:] {
		if v, ok := o.get(name); ok {
			if text[i], err = str(o.at(name), v); err != nil {
				return l, Cost{}, err
			}
			if text[i] == "" {
				return l, Cost{}, errorf(o.at(name), "must not be empty (leave it out for the default)")
			}
		}
	}
	if l.Calendar, err = calendar.Parse(text[0], text[1], text[2], text[3]); err != nil {
		// calendar's errors read "calendar: <field>: <reason>".
		field, reason, _ := strings.Cut(strings.TrimPrefix(err.Error(), "calendar: "), ": ")
		if !contains(quotaFields, field) {
			return l, Cost{}, &Error{Path: path, Err: err}
		}
		return l, Cost{}, errorf(o.at(field), reason)
	}
	// The cost fields, read as a token bucket's whose burst is the limit.
	limit := strconv.FormatFloat(l.Burst, 'g', -1, 64)
	rate := strconv.FormatFloat(min(l.Burst, MaxTokensPerSecond), 'g', -1, 64) // any valid rate: it is not kept
	b := []byte(`{"tokens_per_second":` + rate + `,"burst":` + limit)
	for _, m := range rest {
		b = append(b, ',')
		b = strconv.AppendQuote(b, m.key)
		b = append(b, ':')
		b = append(b, m.value.Raw...)
	}
	b = append(b, '}')
	_, c, err := parseAlgorithmConfig(path, gjson.ParseBytes(b))
	if e, ok := err.(*Error); ok { // a type assertion, not errors.As: the plugin links no reflection for it
		// A cost is bounded by the limit, which the token bucket's words call burst.
		return l, c, errorf(e.Path, strings.ReplaceAll(e.Err.Error(), "<= burst (", "<= limit ("))
	}
	if c.Money != nil {
		l.Burst *= MicroUnits // a price table counts millionths (scaleMoney)
	}
	return l, c, err
}

func contains(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}
