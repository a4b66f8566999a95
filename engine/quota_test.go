package engine_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// quotaOutcome is one request through a plugin on the fake host at now:
// its local reply's status (0 when it went on) and the RateLimit headers it
// carried (the reply's, or the response's).
type quotaOutcome struct {
	status                   int
	policy, rateLimit, retry string
}

// quotaAt runs one request through p at now, the upstream answering
// respStatus with respHeaders.
func quotaAt(t *testing.T, h *fakehost.Host, p *engine.Plugin, now time.Time, respStatus string, respHeaders ...string) quotaOutcome {
	t.Helper()
	h.Clock.Set(now.UnixNano())
	s := newStream("x-tenant", "a")
	r := p.NewRequest(s)
	r.OnRequestHeaders()
	if s.Replied != 0 {
		r.Done()
		return quotaOutcome{status: s.Replied, policy: headerOf(s.ReplyHeaders, "ratelimit-policy"),
			rateLimit: headerOf(s.ReplyHeaders, "ratelimit"), retry: headerOf(s.ReplyHeaders, "retry-after")}
	}
	s.Resp[":status"] = respStatus
	for i := 0; i+1 < len(respHeaders); i += 2 {
		s.Resp[respHeaders[i]] = respHeaders[i+1]
	}
	r.OnResponseHeaders(true)
	r.Done()
	return quotaOutcome{policy: header(s.Added, "ratelimit-policy"), rateLimit: header(s.Added, "ratelimit")}
}

// retryWithin checks a jittered Retry-After: the wait rounded up to whole
// seconds, plus up to half of it.
func retryWithin(t *testing.T, retry string, wait int64) {
	t.Helper()
	n, err := strconv.ParseInt(retry, 10, 64)
	if err != nil || n < wait || n > wait+wait/2 {
		t.Fatalf("Retry-After %q, want %d to %d (the seconds to the boundary, jittered upward)", retry, wait, wait+wait/2)
	}
}

// TestQuotaHourInKathmandu: an hour quota in Asia/Kathmandu (UTC+5:45)
// reports t as the seconds to the next hh:15 UTC and w as 3600, refuses
// past its limit with Retry-After to that moment, and is full again there.
func TestQuotaHourInKathmandu(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, `{"rules": [{"name": "q", "limit_keys": ["header:x-tenant"], "algorithm": "quota",
	  "algorithm_config": {"limit": 3, "period": "hour", "time_zone": "Asia/Kathmandu"}}]}`)
	at := time.Date(2026, 6, 1, 10, 20, 0, 0, time.UTC) // 55 minutes to 11:15 UTC
	for i, tc := range []struct {
		at        time.Time
		status    int
		rateLimit string
		retry     int64
	}{
		{at, 0, `"q";r=2;t=3300`, 0},
		{at.Add(time.Minute), 0, `"q";r=1;t=3240`, 0},
		{at.Add(50 * time.Minute), 0, `"q";r=0;t=300`, 0},
		{at.Add(54*time.Minute + 59*time.Second + 500*time.Millisecond), 429, `"q";r=0;t=1`, 1}, // no refill within the period
		{at.Add(55 * time.Minute), 0, `"q";r=2;t=3600`, 0},                                      // 11:15 UTC: a new period
	} {
		got := quotaAt(t, h, p, tc.at, "200")
		if got.status != tc.status || got.rateLimit != tc.rateLimit || got.policy != `"q";q=3;w=3600` {
			t.Fatalf("step %d at %v: %+v, want status %d, RateLimit %s, RateLimit-Policy \"q\";q=3;w=3600", i, tc.at, got, tc.status, tc.rateLimit)
		}
		if tc.status != 0 {
			retryWithin(t, got.retry, tc.retry)
		}
	}
}

// TestQuotaRefusal403AndMonth: a monthly quota whose rule answers 403;
// RateLimit-Policy's w is the month's length, which changes with the month.
func TestQuotaRefusal403AndMonth(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, `{"rules": [{"name": "m", "algorithm": "quota", "status": 403,
	  "algorithm_config": {"limit": 1, "period": "month", "time_zone": "America/New_York", "anchor": "2026-01-31T00:00:00"}}]}`)
	feb := time.Date(2026, 2, 10, 12, 0, 0, 0, time.UTC) // in [Jan 31, Feb 28) New York
	if got := quotaAt(t, h, p, feb, "200"); got.status != 0 || got.policy != `"m";q=1;w=2419200` {
		t.Fatalf("first: %+v, want allowed with w = 28 days", got)
	}
	got := quotaAt(t, h, p, feb, "200")
	boundary := time.Date(2026, 2, 28, 5, 0, 0, 0, time.UTC) // Feb 28 00:00 EST
	wait := int64(boundary.Sub(feb) / time.Second)
	if got.status != 403 || got.rateLimit != `"m";r=0;t=`+strconv.FormatInt(wait, 10) {
		t.Fatalf("second: %+v, want 403 with t=%d", got, wait)
	}
	retryWithin(t, got.retry, wait)
	// Feb 28 to Mar 31 00:00 EDT: 31 days less the hour the change skips.
	if got := quotaAt(t, h, p, boundary, "200"); got.status != 0 || got.policy != `"m";q=1;w=2674800` {
		t.Fatalf("next month: %+v, want allowed with w = 31 days - 1 hour", got)
	}
}

// TestQuotaStackedAllOrNone: a quota stacked with a token bucket takes from
// both or from neither: a request the token bucket refuses leaves the quota
// as it was, and one the quota refuses leaves the token bucket.
func TestQuotaStackedAllOrNone(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, `{"rules": [
	  {"name": "rate", "limit_keys": ["header:x-tenant"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}},
	  {"name": "daily", "limit_keys": ["header:x-tenant"], "algorithm": "quota", "algorithm_config": {"limit": 2, "period": "day"}}]}`)
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	steps := []struct {
		at     time.Duration
		status int
	}{
		{0, 0},                    // rate 0 left, daily 1
		{time.Second, 429},        // rate refuses: daily keeps its 1
		{1000 * time.Second, 0},   // rate full again: daily 0
		{2000 * time.Second, 429}, // daily refuses: rate keeps its token
		{24 * time.Hour, 0},       // a new day, and the token kept since 2000 s
	}
	for i, st := range steps {
		if got := quotaAt(t, h, p, t0.Add(st.at), "200"); got.status != st.status {
			t.Fatalf("step %d at +%v: %+v, want status %d", i, st.at, got, st.status)
		}
	}
}

// TestQuotaResponseCosts: a quota charged what the response says (into
// debt, bounded), refunded for a status outside charge_on, and full again
// at the boundary, its debt forgiven.
func TestQuotaResponseCosts(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, `{"rules": [{"name": "u", "limit_keys": ["header:x-tenant"], "algorithm": "quota", "charge_on": ["2xx"],
	  "algorithm_config": {"limit": 10, "period": "minute", "cost_source": "response_header:x-usage", "default_cost": 1}}]}`)
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for i, st := range []struct {
		at        time.Duration
		status    string
		usage     string
		refused   int
		rateLimit string
	}{
		{0, "200", "4", 0, `"u";r=6;t=60`},
		{time.Second, "500", "4", 0, `"u";r=6;t=59`},      // refunded: not in charge_on
		{2 * time.Second, "200", "30", 0, `"u";r=0;t=58`}, // 6 left, charged 30: a debt of at most the limit
		{3 * time.Second, "200", "", 429, `"u";r=0;t=57`},
		{60 * time.Second, "200", "1", 0, `"u";r=9;t=60`}, // a new minute: the debt forgiven
	} {
		got := quotaAt(t, h, p, t0.Add(st.at), st.status, "x-usage", st.usage)
		if got.status != st.refused || got.rateLimit != st.rateLimit {
			t.Fatalf("step %d: %+v, want status %d, RateLimit %s", i, got, st.refused, st.rateLimit)
		}
	}
}

// TestQuotaClusterLeaseLoads: a cluster quota with "sync": "lease" loads
// (its leases follow the period's boundary: TestQuotaLeaseFollowsThePeriod
// and the tests beside it).
func TestQuotaClusterLeaseLoads(t *testing.T) {
	cfg := `{"service": {"cluster": "limitd"}, "rules": [{"name": "q", "scope": "cluster", "sync": "lease", "algorithm": "quota",
	  "algorithm_config": {"limit": 10, "period": "day"}}]}`
	if err := engine.CheckConfiguration([]byte(cfg)); err != nil {
		t.Fatalf("CheckConfiguration = %v, want a leased cluster quota to load", err)
	}
}

// BenchmarkQuotaRequest measures one allowed request through a quota rule
// against the same through a token bucket, on the fake host (the decision,
// its shared-data write and the response headers).
func BenchmarkQuotaRequest(b *testing.B) {
	for _, tc := range []struct{ name, cfg string }{
		{"token_bucket", `{"rules": [{"name": "r", "limit_keys": ["header:x-tenant"], "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 1e9, "burst": 1e12}}]}`},
		{"quota", `{"rules": [{"name": "r", "limit_keys": ["header:x-tenant"], "algorithm": "quota",
		  "algorithm_config": {"limit": 1e12, "period": "month", "time_zone": "America/New_York"}}]}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := fakehost.New()
			h.Clock.Set(time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC).UnixNano())
			p := newPlugin(b, h, tc.cfg)
			s := newStream("x-tenant", "a")
			s.Resp[":status"] = "200"
			b.ReportAllocs()
			for b.Loop() {
				h.Clock.Advance(1000)
				s.Added, s.Replied = s.Added[:0], 0
				r := p.NewRequest(s)
				r.OnRequestHeaders()
				r.OnResponseHeaders(true)
				r.Done()
				if s.Replied != 0 {
					b.Fatal("refused")
				}
			}
		})
	}
}

// TestQuotaHostileCosts: cost header values a client chooses (negative,
// zero, tiny, huge, not numbers, above the limit) never take a quota past
// its limit and never give it anything back: what is left only falls within
// the period.
func TestQuotaHostileCosts(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, `{"rules": [{"name": "c", "limit_keys": ["header:x-tenant"], "algorithm": "quota",
	  "algorithm_config": {"limit": 10, "period": "day", "cost_source": "header:x-cost", "default_cost": 1}}]}`)
	h.Clock.Set(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	left := int64(10)
	admitted := 0.0
	for i, v := range []string{"-5", "0", "-0", "1e-300", "NaN", "Infinity", "-Infinity", "1e308", "abc", "", "0x10",
		"2", "11", "-1e308", "3.5", "4", "1", "1", "1", "1"} {
		h.Clock.Advance(int64(time.Second))
		s := newStream("x-tenant", "a", "x-cost", v)
		r := p.NewRequest(s)
		r.OnRequestHeaders()
		if s.Replied == 0 {
			s.Resp[":status"] = "200"
			r.OnResponseHeaders(true)
			rl := header(s.Added, "ratelimit")
			_, rest, _ := strings.Cut(rl, ";r=")
			n, err := strconv.ParseInt(strings.Split(rest, ";")[0], 10, 64)
			if err != nil || n > left {
				t.Fatalf("step %d (x-cost %q): RateLimit %q after %d left: a cost gave tokens back", i, v, rl, left)
			}
			admitted += float64(left - n)
			left = n
		}
		r.Done()
	}
	if left != 0 || admitted > 10 {
		t.Fatalf("left %d, admitted %v: want the limit of 10 spent, no more", left, admitted)
	}
}
