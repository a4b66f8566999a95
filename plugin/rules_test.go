package plugin

import (
	"strings"
)

func limitRule(name, extra string, rate, burst string) string {
	return `{"name": "` + name + `", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": ` + rate + `, "burst": ` + burst + `}` + extra + `}`
}

func rules(top string, rs ...string) string {
	return `{` + top + `"rules": [` + strings.Join(rs, ",") + `]}`
}

// statuses sends n requests with the headers and returns their statuses.
func (e *emulator) statuses(n int, headers ...string) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = e.do(headers...).status
	}
	return out
}

func count(sts []int, status int) int {
	n := 0
	for _, s := range sts {
		if s == status {
			n++
		}
	}
	return n
}
