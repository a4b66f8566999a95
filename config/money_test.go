package config

import (
	"strings"
	"testing"
)

// moneyRule is a rule of a budget in money with algorithm_config's money
// fields ac (the rest of its fields fixed), as the issue writes it.
func moneyRule(ac string) string {
	return `{"rules":[{"name":"spend","limit_keys":["header:x-team"],"algorithm":"token_bucket",
		"algorithm_config":{"tokens_per_second":0.001,"burst":50` + ac + `}}]}`
}

const issuePrices = `,"prices":{"model":"request_json:model","per":1000000,
	"table":{"gpt-4o":{"input":2.5,"output":10,"cached_input":1.25},"*":{"input":1,"output":4}}},
	"cost_terms":[{"source":"response_json:usage.prompt_tokens","price":"input"},
		{"source":"response_json:usage.completion_tokens","price":"output"},
		{"source":"response_json:usage.prompt_tokens_details.cached_tokens","price":"cached_input"}],
	"reserve":{"source":"request_json:max_tokens","price":"output"}`

func TestParseMoney(t *testing.T) {
	cfg, err := Parse([]byte(moneyRule(issuePrices + `,"default_cost":0.5`)))
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, cfg)
	r := cfg.Rules[0]
	m := r.Cost.Money
	if m == nil {
		t.Fatal("Cost.Money is nil")
	}
	if m.Model != (Source{SourceRequestJSON, "model"}) || m.Per != 1000000 {
		t.Errorf("model %v per %d", m.Model, m.Per)
	}
	if got := strings.Join(m.Names, ","); got != "input,output,cached_input" {
		t.Errorf("Names = %s", got)
	}
	row, ok := m.Prices("gpt-4o", true)
	if !ok || row[0] != 2500000 || row[1] != 10000000 || row[2] != 1250000 {
		t.Errorf("gpt-4o = %v, %v", row, ok)
	}
	row, ok = m.Prices("other", true)
	if !ok || row[0] != 1000000 || row[1] != 4000000 || row[2] != 0 {
		t.Errorf("other (\"*\") = %v, %v", row, ok)
	}
	if row, ok = m.Prices("", false); !ok || row[0] != 1000000 {
		t.Errorf("no model (\"*\") = %v, %v", row, ok)
	}
	if len(m.Terms) != 3 || m.Terms[2].Source != (Source{SourceResponseJSON, "usage.prompt_tokens_details.cached_tokens"}) || m.Terms[2].Price != 2 {
		t.Errorf("Terms = %+v", m.Terms)
	}
	if !m.Reserve.Set || m.Reserve.Source != (Source{SourceRequestJSON, "max_tokens"}) || m.Reserve.Price != 1 {
		t.Errorf("Reserve = %+v", m.Reserve)
	}
	// The rule counts millionths.
	if r.Limit.Burst != 50e6 || r.Limit.TokensPerSecond != 1000 || r.Cost.Default != 0.5e6 || r.Cost.Truncated != 50e6 {
		t.Errorf("limit %+v cost default %v truncated %v", r.Limit, r.Cost.Default, r.Cost.Truncated)
	}
	if r.Cost.Source.Kind != SourceResponseJSON || !r.Cost.FromResponse() || r.Cost.MaxBodyBytes != DefaultMaxBodyBytes {
		t.Errorf("cost source %v from response %v max body %d", r.Cost.Source, r.Cost.FromResponse(), r.Cost.MaxBodyBytes)
	}
}

func TestParseMoneyNoDefault(t *testing.T) {
	cfg, err := Parse([]byte(moneyRule(`,"prices":{"model":"header:x-model","table":{"a":{"input":0.000001}}},
		"cost_terms":[{"source":"response_json:usage.input_tokens","price":"input"}]`)))
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Rules[0].Cost.Money
	if m.Per != 1 || m.Default != nil || m.Reserve.Set {
		t.Errorf("per %d default %v reserve %+v", m.Per, m.Default, m.Reserve)
	}
	if row, ok := m.Prices("a", true); !ok || row[0] != 1 {
		t.Errorf("a = %v %v", row, ok)
	}
	if _, ok := m.Prices("b", true); ok {
		t.Error("b is priced with no \"*\"")
	}
}

func TestParseMoneyErrors(t *testing.T) {
	const terms = `,"cost_terms":[{"source":"response_json:usage.prompt_tokens","price":"input"}]`
	for _, tc := range []struct{ name, ac, err string }{
		{"terms without prices", terms, `rules[0].algorithm_config.prices: required with cost_terms and reserve`},
		{"prices without terms", `,"prices":{"model":"request_json:model","table":{"*":{"input":1}}}`,
			`rules[0].algorithm_config.cost_terms: required with prices`},
		{"with cost_source", `,"cost_source":"response_json:x","prices":{"model":"request_json:model","table":{"*":{"input":1}}}` + terms,
			`rules[0].algorithm_config.cost_source: cannot be combined with prices`},
		{"no model", `,"prices":{"table":{"*":{"input":1}}}` + terms,
			`rules[0].algorithm_config.prices.model: required (a request source, for example request_json:model)`},
		{"bad model source", `,"prices":{"model":"request_json:","table":{"*":{"input":1}}}` + terms,
			`rules[0].algorithm_config.prices.model: source "request_json:": path must be 1 to 256 bytes`},
		{"per fraction", `,"prices":{"model":"request_json:model","per":1.5,"table":{"*":{"input":1}}}` + terms,
			`rules[0].algorithm_config.prices.per: must be a whole number, got 1.5`},
		{"empty table", `,"prices":{"model":"request_json:model","table":{}}` + terms,
			`rules[0].algorithm_config.prices.table: must price at least one model`},
		{"negative price", `,"prices":{"model":"request_json:model","table":{"*":{"input":-1}}}` + terms,
			`rules[0].algorithm_config.prices.table["*"].input: must be a price from 0 to 1000000000, got -1`},
		{"price below a millionth", `,"prices":{"model":"request_json:model","table":{"*":{"input":0.0000001}}}` + terms,
			`rules[0].algorithm_config.prices.table["*"].input: must be a whole number of millionths`},
		{"price string", `,"prices":{"model":"request_json:model","table":{"*":{"input":"1"}}}` + terms,
			`rules[0].algorithm_config.prices.table["*"].input: must be a price`},
		{"unknown price name", `,"prices":{"model":"request_json:model","table":{"*":{"input":1}}},"cost_terms":[{"source":"response_json:u","price":"output"}]`,
			`rules[0].algorithm_config.cost_terms[0].price: "output" is priced by no model of the table`},
		{"term from a header", `,"prices":{"model":"request_json:model","table":{"*":{"input":1}}},"cost_terms":[{"source":"header:x","price":"input"}]`,
			`rules[0].algorithm_config.cost_terms[0].source: must be response_json:<path>`},
		{"no terms", `,"prices":{"model":"request_json:model","table":{"*":{"input":1}}},"cost_terms":[]`,
			`rules[0].algorithm_config.cost_terms: must hold 1 to 8 terms`},
		{"reserve from the response", `,"prices":{"model":"request_json:model","table":{"*":{"input":1}}}` + terms + `,"reserve":{"source":"response_json:x","price":"input"}`,
			`rules[0].algorithm_config.reserve.source: unknown source "response_json:x"`},
		{"unknown field", `,"prices":{"model":"request_json:model","table":{"*":{"input":1}},"currency":"EUR"}` + terms,
			`rules[0].algorithm_config.prices.currency: unknown field`},
	} {
		_, err := Parse([]byte(moneyRule(tc.ac)))
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: Parse = %v, want an error holding %s", tc.name, err, tc.err)
		}
	}
	// A budget too large to count in millionths.
	_, err := Parse([]byte(`{"rules":[{"name":"r","algorithm":"token_bucket","algorithm_config":{"tokens_per_second":1,"burst":2000000` +
		`,"prices":{"model":"request_json:model","table":{"*":{"input":1}}},"cost_terms":[{"source":"response_json:u","price":"input"}]}}]}`))
	if want := "burst × 1000000 must be <= 1000000000000"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Parse = %v, want %s", err, want)
	}
}

func TestRequestJSONInKeysAndMatch(t *testing.T) {
	cfg, err := Parse([]byte(`{"rules":[{"name":"r","limit_keys":["request_json:user.id"],
		"match":{"request_json:model":{"in":["gpt-4o","o3"]}},
		"algorithm":"token_bucket","algorithm_config":{"tokens_per_second":1,"burst":1}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Rules[0]
	if r.LimitKeys[0] != (Source{SourceRequestJSON, "user.id"}) || r.Match[0].Source != (Source{SourceRequestJSON, "model"}) {
		t.Errorf("keys %v match %v", r.LimitKeys, r.Match[0].Source)
	}
}

// TestSchemaMoney: the schema accepts what Parse accepts of a price table,
// and refuses a term that is not a response_json path.
func TestSchemaMoney(t *testing.T) {
	sch := compileSchema(t)
	for _, doc := range []string{moneyRule(issuePrices + `,"default_cost":0.5,"max_body_bytes":4096`),
		`{"rules":[{"name":"r","limit_keys":["request_json:user.id"],"match":{"request_json:model":{"equals":"o3"}},
			"algorithm":"token_bucket","algorithm_config":{"tokens_per_second":1,"burst":1}}]}`} {
		if _, err := Parse([]byte(doc)); err != nil {
			t.Fatal(err)
		}
		if err := validate(sch, []byte(doc)); err != nil {
			t.Errorf("schema refuses %s: %v", doc, err)
		}
	}
	bad := moneyRule(`,"prices":{"model":"request_json:model","table":{"*":{"input":1}}},"cost_terms":[{"source":"header:x","price":"input"}]`)
	if err := validate(sch, []byte(bad)); err == nil {
		t.Errorf("schema accepts %s", bad)
	}
}

// TestParseMoneyQuota: "$50 a day" in Europe/Berlin, as the issue writes
// it: the quota counts millionths too.
func TestParseMoneyQuota(t *testing.T) {
	cfg, err := Parse([]byte(`{"rules":[{"name":"daily","limit_keys":["header:x-team"],"algorithm":"quota",
		"algorithm_config":{"limit":50,"period":"day","time_zone":"Europe/Berlin"` + issuePrices + `}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, cfg)
	r := cfg.Rules[0]
	if r.Cost.Money == nil || !r.Limit.Quota() || r.Limit.Burst != 50e6 || r.Cost.Truncated != 50e6 || r.Cost.Default != 1e6 {
		t.Errorf("money %v quota %v limit %v truncated %v default %v", r.Cost.Money != nil, r.Limit.Quota(), r.Limit.Burst, r.Cost.Truncated, r.Cost.Default)
	}
}
