package config

import (
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
)

func parseAlgorithmConfig(path string, v gjson.Result) (Limit, Cost, error) {
	var l Limit
	c := Cost{Source: Source{Kind: SourceFixed}, Fixed: 1, Default: 1}
	o, err := fields(path, v, "tokens_per_second", "rps", "burst", "cost_source", "fixed_cost", "default_cost", "truncated_cost", "max_body_bytes", "max_delay_ms", "max_waiting",
		"prices", "cost_terms", "reserve")
	if err != nil {
		return l, c, err
	}
	rateName := "tokens_per_second"
	_, hasTPS := o.get("tokens_per_second")
	_, hasRPS := o.get("rps")
	switch {
	case hasTPS && hasRPS:
		return l, c, errorf(path+".rps", "cannot be combined with tokens_per_second (rps is its alias)")
	case hasRPS:
		rateName = "rps"
	case !hasTPS:
		return l, c, errorf(path+".tokens_per_second", "required (or its alias rps)")
	}
	if l.TokensPerSecond, err = o.positive(rateName, MaxTokensPerSecond); err != nil {
		return l, c, err
	}
	if _, ok := o.get("burst"); !ok {
		return l, c, errorf(path+".burst", "required")
	}
	if l.Burst, err = o.positive("burst", MaxBurst); err != nil {
		return l, c, err
	}
	if l.MaxDelayMS, err = o.integer("max_delay_ms", 0, 0, MaxDelayMS); err != nil {
		return l, c, err
	}
	if _, ok := o.get("max_waiting"); ok && l.MaxDelayMS == 0 {
		return l, c, errorf(path+".max_waiting", "only with max_delay_ms > 0 (a rule that never holds a request has nothing waiting)")
	}
	if l.MaxDelayMS > 0 {
		if l.MaxWaiting, err = o.integer("max_waiting", DefaultMaxWaiting, 1, MaxMaxWaiting); err != nil {
			return l, c, err
		}
	}
	// A rule that holds requests smooths them to the rate, so its burst
	// may be below the rate (down to one request at a time).
	if l.Burst < l.TokensPerSecond && l.MaxDelayMS == 0 {
		return l, c, errorf(path+".burst", "must be >= "+rateName+" ("+fmtFloat(l.TokensPerSecond)+"), got "+fmtFloat(l.Burst))
	}
	if fill := l.Burst / l.TokensPerSecond; fill > MaxFillSeconds {
		return l, c, errorf(path+".burst", "burst / "+rateName+" is "+fmtFloat(fill)+" seconds to refill, more than one year ("+strconv.Itoa(MaxFillSeconds)+")")
	}
	if v, ok := o.get("cost_source"); ok {
		s, err := str(path+".cost_source", v)
		if err != nil {
			return l, c, err
		}
		if c.Source, err = parseCostSource(s); err != nil {
			return l, c, &Error{Path: path + ".cost_source", Err: err}
		}
	}
	if c.Money, err = parseMoney(path, o); err != nil {
		return l, c, err
	}
	if c.Money != nil {
		c.Source = Source{Kind: SourceResponseJSON} // the terms' paths: c.Money.Terms
	}
	if _, ok := o.get("truncated_cost"); ok && c.Money != nil {
		return l, c, errorf(path+".truncated_cost", "cannot be combined with prices (a response cut short is charged its reservation)")
	}
	if _, ok := o.get("truncated_cost"); ok && c.Source.Kind != SourceResponseJSON {
		return l, c, errorf(path+".truncated_cost", "only with cost_source response_json:<path> (the only cost a response can cut short)")
	}
	for _, f := range []struct {
		name string
		dst  *float64
	}{{"fixed_cost", &c.Fixed}, {"default_cost", &c.Default}, {"truncated_cost", &c.Truncated}} {
		if _, ok := o.get(f.name); !ok {
			continue
		}
		if *f.dst, err = o.positive(f.name, MaxBurst); err != nil {
			return l, c, err
		}
		if *f.dst < MinCost {
			return l, c, errorf(path+"."+f.name, "must be at least "+fmtFloat(MinCost)+" (MinCost), got "+fmtFloat(*f.dst))
		}
		if *f.dst > l.Burst {
			return l, c, errorf(path+"."+f.name, "must be <= burst ("+fmtFloat(l.Burst)+"), got "+fmtFloat(*f.dst)+": such a request could never pass")
		}
	}
	if _, ok := o.get("max_body_bytes"); ok && c.Source.Kind != SourceResponseJSON {
		return l, c, errorf(path+".max_body_bytes", "only with cost_source response_json:<path> (the only cost read from a body)")
	}
	if c.Source.Kind == SourceResponseJSON {
		if _, ok := o.get("truncated_cost"); !ok {
			c.Truncated = l.Burst // the most one request may cost
		}
		if c.MaxBodyBytes, err = o.integer("max_body_bytes", DefaultMaxBodyBytes, 1, MaxMaxBodyBytes); err != nil {
			return l, c, err
		}
	}
	if c.Money != nil {
		return scaleMoney(path, l, c)
	}
	return l, c, nil
}

// parseChargeOn parses a rule's charge_on: a non-empty array of status
// classes ("2xx") and exact statuses ("401"), none repeated or inside a
// class also listed.
func parseChargeOn(path string, v gjson.Result) (StatusSet, error) {
	s := StatusSet{Listed: true}
	items, err := array(path, v)
	if err != nil {
		return s, err
	}
	if len(items) == 0 {
		return s, errorf(path, "must hold at least one status (absent: every response is charged)")
	}
	seen := make(map[string]int)
	for i, e := range items {
		p := jsonfield.Elem(path, i)
		st, err := str(p, e)
		if err != nil {
			return s, err
		}
		class, code, err := parseStatus(st)
		if err != nil {
			return s, &Error{Path: p, Err: err}
		}
		if j, dup := seen[st]; dup {
			return s, errorf(p, strconv.Quote(st)+" repeats "+jsonfield.Elem(path, j))
		}
		seen[st] = i
		if class > 0 {
			s.Classes |= 1 << class
		} else {
			s.Codes = append(s.Codes, code)
		}
	}
	for i, e := range items {
		if _, code, _ := parseStatus(e.String()); code > 0 && s.Classes&(1<<(code/100)) != 0 {
			return s, errorf(jsonfield.Elem(path, i), strconv.Quote(e.String())+" is already in "+strconv.Quote(strconv.Itoa(code/100)+"xx"))
		}
	}
	return s, nil
}
