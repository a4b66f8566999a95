package engine

import (
	"errors"
	"strings"
	"testing"
)

// TestParseFlatMetadata: on a host that reads no nested metadata
// (Options.FlatMetadata, the native module), a jwt: source without
// trust_unverified_jwt is refused, naming its field; elsewhere it parses.
func TestParseFlatMetadata(t *testing.T) {
	const rule = `{"name": "r", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 5}`
	for _, tc := range []struct{ config, want string }{
		{`{"rules": [` + rule + `, "limit_keys": ["jwt:sub"]}]}`, "rules[0].limit_keys[0]"},
		{`{"rules": [` + rule + `, "match": {"jwt:tier": {"equals": "gold"}}}]}`, `rules[0].match["jwt:tier"]`},
		{`{"trust_unverified_jwt": true, "rules": [` + rule + `, "limit_keys": ["jwt:sub"]}]}`, ""},
		{`{"rules": [` + rule + `, "limit_keys": ["header:x-api-key"]}]}`, ""},
	} {
		if _, err := Parse([]byte(tc.config), Options{}); err != nil {
			t.Errorf("%s: refused without FlatMetadata: %v", tc.config, err)
		}
		_, err := Parse([]byte(tc.config), Options{FlatMetadata: true})
		var refusal *RefusalError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.config, err)
		case tc.want != "" && (!errors.As(err, &refusal) || !strings.Contains(err.Error(), "config: "+tc.want+": ")):
			t.Errorf("%s: %v, want a refusal naming %s", tc.config, err, tc.want)
		}
	}
}

// TestReadsResponseBody: only a cost from the response's JSON reads the
// body.
func TestReadsResponseBody(t *testing.T) {
	const alg = `"algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 100`
	for _, tc := range []struct {
		cost string
		want bool
	}{
		{``, false},
		{`, "cost_source": "response_header:x-cost"`, false},
		{`, "cost_source": "response_json:usage.total_tokens"`, true},
	} {
		c, err := Parse([]byte(`{"rules": [{"name": "r", `+alg+tc.cost+`}}]}`), Options{})
		if err != nil {
			t.Fatalf("%q: %v", tc.cost, err)
		}
		if got := c.ReadsResponseBody(); got != tc.want {
			t.Errorf("%q: ReadsResponseBody = %v, want %v", tc.cost, got, tc.want)
		}
	}
}
