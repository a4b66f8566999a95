package config

import (
	"math"
	"slices"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
)

// MicroUnits is how many of a money rule's counting units make one unit of
// its prices and limit: a rule with "prices" counts money in millionths
// (micro-units), so its ledger is exact to a millionth. Its limit, burst,
// rate, default_cost and truncated_cost are scaled by MicroUnits at load
// time, and its RateLimit headers report millionths.
const MicroUnits = 1e6

// MaxPer bounds "per", and MaxPrice a price in units (a price in
// micro-units then fits in 2^53: exact in a float64).
const (
	MaxPer   = 1e12
	MaxPrice = 1e9
)

// Money is a rule's price table (algorithm_config "prices", "cost_terms"
// and "reserve"): a response costs the sum of its terms, each a usage
// value from the response times its model's price over Per, in
// micro-units (MicroUnits), rounded up to a whole micro-unit.
type Money struct {
	// Model is where the request names its model (a request source, for
	// example request_json:model).
	Model Source
	// Per is the usage a price is for (1000000: prices per million tokens).
	Per uint64
	// Names are the price names the table uses ("input", "output"...);
	// Table maps a model to its prices in micro-units, indexed as Names (0
	// where the model's row lacks the name); Default is the "*" row, nil
	// when the table has none.
	Names   []string
	Table   map[string][]uint64
	Default []uint64
	// Terms are the usage values a response is charged for: each a
	// response_json path (or response_header) and the index in Names of
	// its price.
	Terms []MoneyTerm
	// Reserve, when Reserve.Set, is what a request reserves: a request
	// value (for example request_json:max_tokens) times its model's price
	// Reserve.Price; a request without it reserves Cost.Default.
	Reserve MoneyTerm
}

// MoneyTerm is one usage value and the index in Money.Names of its price.
type MoneyTerm struct {
	Source Source
	Price  int
	Set    bool
}

// Prices returns the model's row of prices (micro-units per Per), the
// "*" row for a model the table does not list, and false when neither
// exists.
func (m *Money) Prices(model string, found bool) ([]uint64, bool) {
	if found {
		if row, ok := m.Table[model]; ok {
			return row, true
		}
	}
	return m.Default, m.Default != nil
}

// parseMoney parses the money fields of an algorithm_config (o), when
// "prices" is present; nil otherwise. cost is the rest of the cost
// configuration, for the checks that combine them.
func parseMoney(path string, o object) (*Money, error) {
	pv, hasPrices := o.get("prices")
	_, hasTerms := o.get("cost_terms")
	_, hasReserve := o.get("reserve")
	if !hasPrices {
		if hasTerms || hasReserve {
			return nil, errorf(path+".prices", "required with cost_terms and reserve")
		}
		return nil, nil
	}
	if !hasTerms {
		return nil, errorf(path+".cost_terms", "required with prices")
	}
	if _, ok := o.get("cost_source"); ok {
		return nil, errorf(path+".cost_source", "cannot be combined with prices (cost_terms say what a response costs)")
	}
	if _, ok := o.get("fixed_cost"); ok {
		return nil, errorf(path+".fixed_cost", "cannot be combined with prices")
	}
	m := &Money{Per: 1, Table: map[string][]uint64{}}
	pp := path + ".prices"
	po, err := fields(pp, pv, "model", "per", "table")
	if err != nil {
		return nil, err
	}
	mv, ok := po.get("model")
	if !ok {
		return nil, errorf(pp+".model", "required (a request source, for example request_json:model)")
	}
	s, err := str(pp+".model", mv)
	if err != nil {
		return nil, err
	}
	if m.Model, err = parseSource(s); err != nil {
		return nil, &Error{Path: pp + ".model", Err: err}
	}
	if _, ok := po.get("per"); ok {
		per, err := po.positive("per", MaxPer)
		if err != nil {
			return nil, err
		}
		if per != math.Trunc(per) {
			return nil, errorf(pp+".per", "must be a whole number, got "+fmtFloat(per))
		}
		m.Per = uint64(per)
	}
	tv, ok := po.get("table")
	if !ok {
		return nil, errorf(pp+".table", "required")
	}
	rows, err := members(pp+".table", tv)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, errorf(pp+".table", "must price at least one model (or \"*\", every model)")
	}
	type cell struct {
		name  string
		price uint64
	}
	parsed := make(map[string][]cell, len(rows))
	for _, row := range rows {
		if row.key == "" || hasControl(row.key) {
			return nil, errorf(row.at, "model name must be non-empty, without control characters")
		}
		cells, err := members(row.at, row.value)
		if err != nil {
			return nil, err
		}
		for _, c := range cells {
			if !isToken(c.key) {
				return nil, errorf(c.at, "price name must be a non-empty token (letters, digits, _ -)")
			}
			if c.value.Type != gjson.Number || !(c.value.Num >= 0) || c.value.Num > MaxPrice {
				return nil, errorf(c.at, "must be a price from 0 to "+fmtFloat(MaxPrice)+", got "+shorten(c.value.Raw))
			}
			micro := c.value.Num * MicroUnits
			if math.Abs(micro-math.Round(micro)) > 1e-6*math.Max(1, micro) {
				return nil, errorf(c.at, "must be a whole number of millionths, got "+shorten(c.value.Raw))
			}
			if !slices.Contains(m.Names, c.key) {
				m.Names = append(m.Names, c.key)
			}
			parsed[row.key] = append(parsed[row.key], cell{c.key, uint64(math.Round(micro))})
		}
	}
	for model, cells := range parsed {
		r := make([]uint64, len(m.Names))
		for _, c := range cells {
			r[slices.Index(m.Names, c.name)] = c.price
		}
		if model == "*" {
			m.Default = r
		} else {
			m.Table[model] = r
		}
	}
	for _, row := range rows {
		if _, ok := parsed[row.key]; !ok {
			r := make([]uint64, len(m.Names)) // a row with no price: every term costs 0
			if row.key == "*" {
				m.Default = r
			} else {
				m.Table[row.key] = r
			}
		}
	}
	tp := path + ".cost_terms"
	tv, _ = o.get("cost_terms")
	items, err := array(tp, tv)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 || len(items) > MaxCostTerms {
		return nil, errorf(tp, "must hold 1 to "+strconv.Itoa(MaxCostTerms)+" terms")
	}
	for i, it := range items {
		t, err := parseMoneyTerm(jsonfield.Elem(tp, i), it, m, true)
		if err != nil {
			return nil, err
		}
		m.Terms = append(m.Terms, t)
	}
	if rv, ok := o.get("reserve"); ok {
		if m.Reserve, err = parseMoneyTerm(path+".reserve", rv, m, false); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// MaxCostTerms bounds a price table's cost_terms.
const MaxCostTerms = 8

// parseMoneyTerm parses {"source", "price"}: a response_json or
// response_header source for a cost term (response), a request source
// for the reserve.
func parseMoneyTerm(path string, v gjson.Result, m *Money, response bool) (MoneyTerm, error) {
	o, err := fields(path, v, "source", "price")
	if err != nil {
		return MoneyTerm{}, err
	}
	sv, ok := o.get("source")
	if !ok {
		return MoneyTerm{}, errorf(path+".source", "required")
	}
	s, err := str(path+".source", sv)
	if err != nil {
		return MoneyTerm{}, err
	}
	t := MoneyTerm{Set: true}
	if response {
		t.Source, err = parseCostSource(s)
		if err == nil && t.Source.Kind != SourceResponseJSON {
			return t, errorf(path+".source", "must be response_json:<path> (a usage value of the response), got "+strconv.Quote(s))
		}
	} else {
		t.Source, err = parseSource(s)
	}
	if err != nil {
		return t, &Error{Path: path + ".source", Err: err}
	}
	pv, ok := o.get("price")
	if !ok {
		return t, errorf(path+".price", "required (a price name of the table)")
	}
	name, err := str(path+".price", pv)
	if err != nil {
		return t, err
	}
	if t.Price = slices.Index(m.Names, name); t.Price < 0 {
		return t, errorf(path+".price", strconv.Quote(name)+" is priced by no model of the table")
	}
	return t, nil
}

// scaleMoney counts a money rule in micro-units: its rate, burst and costs
// in units become millionths (MicroUnits).
func scaleMoney(path string, l Limit, c Cost) (Limit, Cost, error) {
	if l.Burst*MicroUnits > MaxBurst {
		return l, c, errorf(path+".burst", "a money rule counts millionths: burst × 1000000 must be <= "+fmtFloat(MaxBurst)+", got burst "+fmtFloat(l.Burst))
	}
	l.TokensPerSecond *= MicroUnits
	l.Burst *= MicroUnits
	c.Default *= MicroUnits
	c.Truncated *= MicroUnits
	return l, c, nil
}
