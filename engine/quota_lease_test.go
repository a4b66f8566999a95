package engine_test

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// leasedQuota is a minute quota of 100 in scope cluster with leases (a
// first lease asks for max_share × limit / 4 = 12.5 tokens).
const leasedQuota = `{"service": {"cluster": "limitd", "failure_mode": "deny"}, "rules": [
  {"name": "q", "scope": "cluster", "sync": "lease", "lease": {"max_share": 0.5}, "limit_keys": ["header:k"],
   "algorithm": "quota", "algorithm_config": {"limit": 100, "period": "minute"}}]}`

// minute0 is 12:00 UTC: the quota's periods are [12:00, 12:01), [12:01, 12:02).
var minute0 = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

// quotaLeasePlugin is a Plugin of leasedQuota on a fake host at at.
func quotaLeasePlugin(t *testing.T, at time.Time) (*fakehost.Host, *engine.Plugin) {
	t.Helper()
	h := fakehost.New()
	h.Clock.Set(at.UnixNano())
	p, err := engine.New(h, []byte(leasedQuota), "root", engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return h, p
}

// quotaGrant is a lease answer granting tokens to one bucket, with left
// tokens in the period's counter.
func quotaGrant(tokens float64, left int64) *engine.Answer {
	a := &wire.LeaseAnswer{Granted: true, Buckets: []wire.Grant{{Tokens: tokens, Remaining: left, ResetMs: 30000}}}
	return &engine.Answer{Status: "200", Body: wire.AppendLeaseAnswer(nil, a)}
}

// periodIn is the wire's fields of the minute that starts at start, as a
// lease call carries them.
func periodIn(start time.Time) string {
	return `"period_start_ms":` + strconv.FormatInt(start.UnixMilli(), 10) + `,"period_end_ms":` + strconv.FormatInt(start.Add(time.Minute).UnixMilli(), 10)
}

// quotaRequest starts one request of tenant k; it returns its action and
// stream.
func quotaRequest(p *engine.Plugin) (engine.Action, *fakehost.Stream, *engine.Request) {
	s := fakehost.NewStream("k", "a")
	r := p.NewRequest(s)
	return r.OnRequestHeaders(), s, r
}

// TestQuotaLeaseFollowsThePeriod: a lease of a cluster quota is taken for
// the period that holds the plugin's now (the call carries it, rate 0),
// spent in that period only: the first request after the boundary finds
// the old period's tokens worthless and calls for a lease of the new one.
func TestQuotaLeaseFollowsThePeriod(t *testing.T) {
	h, p := quotaLeasePlugin(t, minute0.Add(30*time.Second))
	a, s, r := quotaRequest(p)
	if a != engine.Pause || len(h.Calls) != 1 {
		t.Fatalf("first request: %v with %d calls, want a pause on its lease call", a, len(h.Calls))
	}
	body := string(h.Calls[0].Call.Body)
	if !strings.Contains(body, `"tokens_per_second":0`) || !strings.Contains(body, periodIn(minute0)) {
		t.Fatalf("lease call %s\nwant rate 0 and the period %s", body, periodIn(minute0))
	}
	h.TakeCalls()[0].Answer(quotaGrant(12.5, 87))
	if s.Resumed != 1 || s.Replied != 0 {
		t.Fatalf("first request resumed %d, replied %d: want it admitted", s.Resumed, s.Replied)
	}
	r.Done()
	for i := range 3 { // spent from the lease: no call
		if a, _, r := quotaRequest(p); a != engine.Continue || len(h.Calls) != 0 {
			t.Fatalf("request %d in the period: %v with %d calls, want it admitted from the lease", i, a, len(h.Calls))
		} else {
			r.Done()
		}
	}
	h.Clock.Set(minute0.Add(time.Minute + 100*time.Millisecond).UnixNano())
	a, s, r = quotaRequest(p)
	if a != engine.Pause || len(h.Calls) != 1 {
		t.Fatalf("first request of the next period: %v with %d calls, want a pause on a lease call (the old lease is worthless)", a, len(h.Calls))
	}
	if body := string(h.Calls[0].Call.Body); !strings.Contains(body, periodIn(minute0.Add(time.Minute))) {
		t.Fatalf("lease call %s\nwant the next period %s", body, periodIn(minute0.Add(time.Minute)))
	}
	h.TakeCalls()[0].Answer(quotaGrant(12.5, 87))
	if s.Resumed != 1 {
		t.Fatalf("next period's request resumed %d, want admitted from its new lease", s.Resumed)
	}
	r.Done()
}

// TestQuotaLeaseLateAnswer: a lease call sent in one period and answered
// in the next grants tokens of the period the service answered for (the
// one the call carried): the waiting request does not spend them, nor
// does any later request; it calls once more, for the new period.
func TestQuotaLeaseLateAnswer(t *testing.T) {
	h, p := quotaLeasePlugin(t, minute0.Add(59900*time.Millisecond))
	a, s, r := quotaRequest(p)
	if a != engine.Pause || len(h.Calls) != 1 {
		t.Fatalf("request: %v with %d calls, want a pause on its lease call", a, len(h.Calls))
	}
	h.Clock.Set(minute0.Add(time.Minute + 100*time.Millisecond).UnixNano())
	h.TakeCalls()[0].Answer(quotaGrant(12.5, 50))
	if s.Resumed != 0 || s.Replied != 0 || len(h.Calls) != 1 {
		t.Fatalf("after a late grant: resumed %d, replied %d, %d calls; want the request waiting on a new call", s.Resumed, s.Replied, len(h.Calls))
	}
	if body := string(h.Calls[0].Call.Body); !strings.Contains(body, periodIn(minute0.Add(time.Minute))) {
		t.Fatalf("second lease call %s\nwant the new period %s", body, periodIn(minute0.Add(time.Minute)))
	}
	// Another request meanwhile finds no token of this period in the lease.
	a2, s2, r2 := quotaRequest(p)
	if a2 == engine.Continue {
		t.Fatal("a request admitted from the late grant of the ended period")
	}
	h.TakeCalls()[0].Answer(quotaGrant(3, 47))
	if s.Resumed != 1 || s.Replied != 0 {
		t.Fatalf("after the new period's grant: resumed %d, replied %d; want admitted", s.Resumed, s.Replied)
	}
	r.Done()
	s2.Done = true
	r2.Done()
}

// TestQuotaLeaseNoReturnAfterBoundary: the unspent tokens of an ended
// period are dropped, never handed back (the counter restarted); the
// expired lease of the current period goes back with its period.
func TestQuotaLeaseNoReturnAfterBoundary(t *testing.T) {
	h, p := quotaLeasePlugin(t, minute0.Add(50*time.Second))
	a, _, r := quotaRequest(p)
	if a != engine.Pause {
		t.Fatalf("request: %v, want a pause on its lease call", a)
	}
	h.TakeCalls()[0].Answer(quotaGrant(12.5, 87))
	r.Done()
	h.TakeCalls()
	// Past the boundary and the lease's ttl (2 s): the tick looks at it.
	h.Clock.Set(minute0.Add(time.Minute + 5*time.Second).UnixNano())
	p.Tick(&runtime.MemStats{})
	for _, c := range h.TakeCalls() {
		t.Fatalf("a call after the boundary: %s; want the old period's tokens dropped, not returned", c.Call.Body)
	}
	// A lease of this period that expires goes back, carrying its period.
	a, _, r = quotaRequest(p)
	if a != engine.Pause {
		t.Fatalf("request of the new period: %v, want a pause on its lease call", a)
	}
	h.TakeCalls()[0].Answer(quotaGrant(12.5, 87))
	r.Done()
	h.Clock.Set(minute0.Add(time.Minute + 10*time.Second).UnixNano())
	p.Tick(&runtime.MemStats{})
	calls := h.TakeCalls()
	if len(calls) != 1 || !strings.Contains(string(calls[0].Call.Body), `"return":11.5`) || !strings.Contains(string(calls[0].Call.Body), periodIn(minute0.Add(time.Minute))) {
		var bodies []string
		for _, c := range calls {
			bodies = append(bodies, string(c.Call.Body))
		}
		t.Fatalf("calls %q, want one return of 11.5 tokens with its period", bodies)
	}
}

// quotaRefusal is a lease answer refusing one bucket: the period's count
// is spent, until its end retry away.
func quotaRefusal(retry time.Duration) *engine.Answer {
	a := &wire.LeaseAnswer{Buckets: []wire.Grant{{Remaining: 0, RetryAfterMs: retry.Milliseconds(), ResetMs: retry.Milliseconds()}}}
	return &engine.Answer{Status: "200", Body: wire.AppendLeaseAnswer(nil, a)}
}

// TestQuotaLeaseRefusalStands: once limitd refused a quota's lease (the
// period's count spent), the Envoy refuses the requests that find the
// lease short without calling, for a second at most and never past the
// period's end, with Retry-After to the boundary; the first request of the
// next period calls.
func TestQuotaLeaseRefusalStands(t *testing.T) {
	h, p := quotaLeasePlugin(t, minute0.Add(40*time.Second))
	a, s, r := quotaRequest(p)
	if a != engine.Pause || len(h.Calls) != 1 {
		t.Fatalf("request: %v with %d calls, want a pause on its lease call", a, len(h.Calls))
	}
	h.TakeCalls()[0].Answer(quotaRefusal(20 * time.Second))
	if s.Replied != 429 {
		t.Fatalf("replied %d, want 429", s.Replied)
	}
	r.Done()
	h.Clock.Set(minute0.Add(40*time.Second + 500*time.Millisecond).UnixNano())
	a, s, r = quotaRequest(p)
	if len(h.Calls) != 0 || s.Replied != 429 {
		t.Fatalf("request after the refusal: %v, %d calls, replied %d; want 429 without a call", a, len(h.Calls), s.Replied)
	}
	var retry string
	for _, kv := range s.ReplyHeaders {
		if kv[0] == "retry-after" {
			retry = kv[1]
		}
	}
	if n, err := strconv.Atoi(retry); err != nil || n < 19 || n > 30 {
		t.Fatalf("Retry-After %q, want the 19.5 s to the boundary (jittered upward by up to a half)", retry)
	}
	r.Done()
	// A refusal just before the boundary whose wait runs past it (limitd's
	// clock behind the Envoy's): it does not stand in the next period.
	h.Clock.Set(minute0.Add(59500 * time.Millisecond).UnixNano())
	if _, _, r := quotaRequest(p); len(h.Calls) != 1 {
		t.Fatalf("request after the refusal's second: %d calls, want its lease call", len(h.Calls))
	} else {
		h.TakeCalls()[0].Answer(quotaRefusal(2 * time.Second))
		r.Done()
	}
	h.Clock.Set(minute0.Add(time.Minute).UnixNano())
	if a, _, r := quotaRequest(p); a != engine.Pause || len(h.Calls) != 1 {
		t.Fatalf("first request of the next period: %v with %d calls, want a pause on its lease call", a, len(h.Calls))
	} else {
		h.TakeCalls()[0].Answer(quotaGrant(12.5, 87))
		r.Done()
	}
}
