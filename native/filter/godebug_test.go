package filter

import (
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/config"
)

func TestCgocheckOff(t *testing.T) {
	for _, tc := range []struct {
		godebug string
		want    bool
	}{
		{"", false},
		{"cgocheck=0", true},
		{"cgocheck=1", false},
		{"madvdontneed=1,cgocheck=0", true},
		{"cgocheck=0,cgocheck=1", false}, // the last one wins
		{"cgocheck=1, cgocheck=0", true},
		{"xcgocheck=0", false},
	} {
		if got := cgocheckOff(tc.godebug); got != tc.want {
			t.Errorf("cgocheckOff(%q) = %v, want %v", tc.godebug, got, tc.want)
		}
	}
}

func TestCheckHostJWT(t *testing.T) {
	const rule = `{"name": "r", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 5}`
	for _, tc := range []struct{ config, want string }{
		{`{"rules": [` + rule + `, "limit_keys": ["jwt:sub"]}]}`, "rules[0].limit_keys[0]"},
		{`{"rules": [` + rule + `, "match": {"jwt:tier": {"equals": "gold"}}}]}`, `rules[0].match["jwt:tier"]`},
		{`{"trust_unverified_jwt": true, "rules": [` + rule + `, "limit_keys": ["jwt:sub"]}]}`, ""},
		{`{"rules": [` + rule + `, "limit_keys": ["header:x-api-key"]}]}`, ""},
	} {
		cfg, err := config.Parse([]byte(tc.config))
		if err != nil {
			t.Fatalf("%s: %v", tc.config, err)
		}
		err = checkHost(cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.config, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), "config: "+tc.want+": ")):
			t.Errorf("%s: %v, want a refusal naming %s", tc.config, err, tc.want)
		}
	}
}
