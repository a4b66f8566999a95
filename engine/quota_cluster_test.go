package engine_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// clusterQuota is an hour quota in Asia/Kathmandu (UTC+5:45) in scope
// cluster, per request, by header k.
const clusterQuota = `{"service": {"cluster": "limitd", "timeout_ms": 30},
 "rules": [{"name": "q", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "quota",
   "algorithm_config": {"limit": 10, "period": "hour", "time_zone": "Asia/Kathmandu"}}]}`

// TestQuotaClusterCall: a cluster quota's decision carries its rate 0, its
// limit as the burst and the period that holds the plugin's now
// (period_start_ms, period_end_ms: 10:15 to 11:15 UTC), the next period's
// after the boundary; the service's refusal answers Retry-After to the
// boundary.
func TestQuotaClusterCall(t *testing.T) {
	w := newWorld(t, clusterQuota)
	at := time.Date(2026, 6, 1, 10, 20, 0, 0, time.UTC)
	start := time.Date(2026, 6, 1, 10, 15, 0, 0, time.UTC)
	w.h.Clock.Set(at.UnixNano())
	s, r := w.open("k", "a")
	if s.action != engine.Pause || len(s.Calls) != 1 {
		t.Fatalf("action %v, %d calls; want a pause on one call", s.action, len(s.Calls))
	}
	want := `"tokens_per_second":0,"burst":10,"period_start_ms":` + itoa(start.UnixMilli()) + `,"period_end_ms":` + itoa(start.Add(time.Hour).UnixMilli()) + `,"cost":1}`
	if line := render(s.Calls[0].Call); !strings.Contains(line, want) {
		t.Fatalf("call %s\nwant %s in it", line, want)
	}
	s.Calls[0].Answer(ok(`{"allowed":false,"retry_after_ms":3300000,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":3300000,"reset_ms":3300000}]}`))
	if s.Replied != 429 {
		t.Fatalf("replied %d, want 429", s.Replied)
	}
	retryWithin(t, headerOf(s.ReplyHeaders, "retry-after"), 3300)
	w.end(s, r)

	w.h.Clock.Set(start.Add(time.Hour).UnixNano()) // 11:15 UTC: the next period
	s, r = w.open("k", "a")
	want = `"period_start_ms":` + itoa(start.Add(time.Hour).UnixMilli()) + `,"period_end_ms":` + itoa(start.Add(2*time.Hour).UnixMilli())
	if line := render(s.Calls[0].Call); !strings.Contains(line, want) {
		t.Fatalf("call %s\nwant %s in it", line, want)
	}
	s.Calls[0].Answer(ok(admits))
	w.end(s, r)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
