package plugin

import (
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/config"
)

// BenchmarkRegexWorstCase measures one regex condition on the worst value
// it can be given: as long as it reads (Condition.RegexMaxInput) and built
// to keep Go's regexp busy (near-matches all along). The figure, times
// config.MaxRegexConditions, is the worst regex cost of one request (see
// docs/RATIONALE.md).
func BenchmarkRegexWorstCase(b *testing.B) {
	for _, tc := range []struct {
		re  string
		run int // near-match run length: the longest run that does not match
	}{{`^(free|pro|enterprise)$`, 8}, {`^/api/v[0-9]+/`, 8}, {`[0-9a-f]{64}`, 63}, {`[a-z]{90}`, 89}, {`(a|b|c|d|e|f|g|h)+z`, 64}} {
		re := tc.re
		c, err := config.Parse([]byte(`{"rules": [{"name": "r", "match": {"header:x": {"regex": "` + re + `"}},
		  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 1}}]}`))
		if err != nil {
			b.Fatal(err)
		}
		cond := c.Rules[0].Match[0]
		n := tc.run
		v := strings.Repeat(strings.Repeat("a", n)+"!", cond.RegexMaxInput/(n+1)+1)[:cond.RegexMaxInput]
		b.Run(re, func(b *testing.B) {
			b.ReportMetric(float64(cond.RegexMaxInput), "bytes-read")
			for b.Loop() {
				cond.Regex.MatchString(v)
			}
		})
	}
}
