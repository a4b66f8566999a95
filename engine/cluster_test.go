package engine_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// mixed is a local rule (burst 3) and a per-request cluster rule, both by
// header k.
const mixed = `{"service": {"cluster": "limit_service", "timeout_ms": 30, "token": "s3cret"},
 "rules": [
  {"name": "local", "limit_keys": ["header:k"], "algorithm": "token_bucket",
   "algorithm_config": {"tokens_per_second": 1, "burst": 3}},
  {"name": "fleet", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket",
   "algorithm_config": {"tokens_per_second": 5, "burst": 10}}]}`

// withService is mixed with more service fields (each followed by a comma).
func withService(fields string) string {
	return strings.Replace(mixed, `"timeout_ms": 30`, fields+`"timeout_ms": 30`, 1)
}

const (
	admits  = `{"allowed":true,"buckets":[{"allowed":true,"remaining":9,"retry_after_ms":0,"reset_ms":200}]}`
	refuses = `{"allowed":false,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":1500,"reset_ms":2000}]}`
)

// ok is a 200 answer with body.
func ok(body string) *engine.Answer { return &engine.Answer{Status: "200", Body: []byte(body)} }

// render is a call as one line: the cluster, the headers, the body.
func render(c *engine.Call) string {
	b := c.Cluster
	for _, h := range c.Headers {
		b += " " + h[0] + "=" + h[1]
	}
	return b + " " + string(c.Body)
}

// calledOut is a request whose decision waits for a call of its own, the
// answer the limit service gives it, and what the host sees.
type calledOut struct {
	name   string
	cfg    string
	answer *engine.Answer
	// What the host sees: the call (each part in render's line), the
	// reply's status (0: the request went on) and its headers and body,
	// metrics, and the tokens the local rule holds for k=a after.
	sent    []string
	status  int
	headers map[string]string
	body    string
	metrics map[string]int64
	holds   int
}

// TestClusterCalls: a request under a per-request cluster rule pauses on
// one call to the limit service, with its buckets; the answer admits it
// (resumed) or rejects it (a reply; the local rule's token back); a failed
// or malformed answer follows failure_mode and counts in service_errors
// (defect 4: "allowed" false with no refusing bucket, or true with one, is
// malformed; with "deny" the local tokens are given back once, with
// "allow" not at all).
func TestClusterCalls(t *testing.T) {
	table := []calledOut{
		{name: "admitted: the call, then the RateLimit header of the rule closest to its limit", cfg: mixed, answer: ok(admits),
			// one cluster rule: no hash tag
			sent: []string{"limit_service ", ":method=POST", ":path=/v1/decide", ":authority=limit_service", "authorization=Bearer s3cret",
				` {"buckets":[{"key":"fleet:`, `"tokens_per_second":5,"burst":10,"cost":1}]}`},
			// local has 2 of 3 left (0.67), fleet 9 of 10
			headers: map[string]string{"ratelimit": `"local";r=2;t=1`}, holds: 2},
		{name: "refused: the local token back", cfg: mixed, answer: ok(refuses),
			status: 429, headers: map[string]string{"retry-after": "2|3", "ratelimit": `"fleet";r=0;t=2`}, holds: 3},
	}
	fail := map[string]*engine.Answer{
		"timeout":                                {Failed: true},
		"status":                                 {Status: "503", Body: []byte("oops")},
		"not json":                               ok("{nope"),
		"too short":                              ok(`{"allowed":true,"buckets":[]}`),
		"too large":                              {Status: "200", TooLarge: true},
		"malformed: refused by no bucket":        ok(`{"allowed":false,"buckets":[{"allowed":true,"remaining":9,"retry_after_ms":0,"reset_ms":200}]}`),
		"malformed: admitted, a bucket refusing": ok(`{"allowed":true,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":900,"reset_ms":900}]}`),
	}
	for name, a := range fail {
		table = append(table,
			calledOut{name: "allow: " + name, cfg: withService(`"failure_mode": "allow", `), answer: a,
				metrics: map[string]int64{"service_errors": 1, "refunds": 0}, holds: 2},
			calledOut{name: "deny: " + name, cfg: withService(`"failure_mode": "deny", `), answer: a,
				status: 429, body: "limit_service_unavailable", metrics: map[string]int64{"service_errors": 1, "refunds": 1}, holds: 3})
	}
	for _, tc := range table {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, tc.cfg)
			s, r := w.open("k", "a")
			if s.action != engine.Pause || len(s.Calls) != 1 || len(w.h.Calls) != 0 {
				t.Fatalf("action %v, %d calls of the request, %d of the plugin; want a pause on one of the request", s.action, len(s.Calls), len(w.h.Calls))
			}
			line := render(s.Calls[0].Call)
			for _, part := range tc.sent {
				if !strings.Contains(line, part) {
					t.Errorf("call %s: want %q in it", line, part)
				}
			}
			s.Calls[0].Answer(tc.answer)
			got := map[string]string{}
			switch {
			case tc.status == 0 && (s.Resumed != 1 || s.Replied != 0):
				t.Fatalf("resumed %d, replied %d; want the request resumed", s.Resumed, s.Replied)
			case tc.status == 0:
				s.Resp = map[string]string{":status": "200"}
				r.OnResponseHeaders(true)
				for _, h := range s.Added {
					got[h[0]] = h[1]
				}
			case s.Replied != tc.status || s.Resumed != 0:
				t.Fatalf("replied %d, resumed %d; want a reply %d", s.Replied, s.Resumed, tc.status)
			default:
				for _, h := range s.ReplyHeaders {
					got[h[0]] = h[1]
				}
			}
			for k, v := range tc.headers {
				if !oneOf(got[k], v) {
					t.Errorf("%s = %q, want %q (%v)", k, got[k], v, got)
				}
			}
			if !strings.Contains(string(s.ReplyBody), tc.body) {
				t.Errorf("reply body %q, want %q in it", string(s.ReplyBody), tc.body)
			}
			for name, want := range tc.metrics {
				if got := w.count(name); got != want {
					t.Errorf("%s = %d, want %d", name, got, want)
				}
			}
			w.end(s, r)
			w.localHolds("k", "a", tc.holds)
		})
	}
}

// localHolds checks that the local rule of mixed holds exactly n tokens for
// the key: n requests pass it (and wait on the call), the next is rejected
// locally.
func (w *world) localHolds(k, v string, n int) {
	w.t.Helper()
	for i := 0; i <= n; i++ {
		s, r := w.open(k, v)
		if rejected := s.Replied != 0; rejected != (i == n) {
			w.t.Fatalf("request %d: rejected %v; the local bucket should hold %d", i, rejected, n)
		}
		w.end(s, r)
	}
}

// TestClusterKeys: a bucket's key in the limit service is its rule's name
// and its key values' hash, with no hash tag: the same with one cluster
// rule or two (a hash tag sent only with two or more moved every bucket
// when a second rule was added); with service.key_secret, an HMAC of the
// values under the secret: not the unkeyed hash anyone can compute,
// different under another secret, the same for the same value.
func TestClusterKeys(t *testing.T) {
	body := func(cfg, value string) string {
		w := newWorld(t, cfg)
		s, _ := w.open("k", value)
		if len(s.Calls) != 1 {
			t.Fatalf("%d calls, want 1", len(s.Calls))
		}
		return string(s.Calls[0].Call.Body)
	}
	fleetKey := func(body string) string {
		i := strings.Index(body, `"key":"fleet:`)
		if i < 0 {
			t.Fatalf("no fleet bucket in %s", body)
		}
		return body[i+7 : i+7+strings.Index(body[i+7:], `"`)]
	}
	two := strings.Replace(mixed, `{"name": "local", "limit_keys"`, `{"name": "local", "scope": "cluster", "limit_keys"`, 1)
	one, both := body(mixed, "a"), body(two, "a")
	if strings.Contains(both, "hash_tag") || strings.Count(both, `"key"`) != 2 || strings.Contains(one, "hash_tag") {
		t.Fatalf("bodies %s and %s: want one call with every bucket and no hash tag", one, both)
	}
	keyed, other := withService(`"key_secret": "0123456789abcdef-one", `), withService(`"key_secret": "0123456789abcdef-two", `)
	for _, c := range []struct {
		name string
		a, b string
		same bool
	}{
		{"one cluster rule or two", fleetKey(one), fleetKey(both), true},
		{"keyed: not the unkeyed hash", fleetKey(body(keyed, "a")), fleetKey(one), false},
		{"keyed: the same for the same value", fleetKey(body(keyed, "a")), fleetKey(body(keyed, "a")), true},
		{"keyed: another secret", fleetKey(body(keyed, "a")), fleetKey(body(other, "a")), false},
		{"keyed: another value", fleetKey(body(keyed, "a")), fleetKey(body(keyed, "b")), false},
	} {
		if (c.a == c.b) != c.same {
			t.Errorf("%s: keys %s and %s, want the same: %v", c.name, c.a, c.b, c.same)
		}
	}
	if k := fleetKey(body(keyed, "a")); len(k) != len("fleet:")+32 {
		t.Errorf("keyed key %s: want the rule name and 32 hex digits", k)
	}
}

// TestLateAnswerAfterEnvoyAnswered: Envoy answers a request paused for the
// limit service itself (its stream timeout), then the service's refusal
// arrives: the local rule's token is not refunded a second time (charge_on
// already gave it back), and no reply is attempted.
func TestLateAnswerAfterEnvoyAnswered(t *testing.T) {
	w := newWorld(t, `{"service": {"cluster": "limitd"}, "rules": [
	  {"name": "local", "charge_on": ["2xx"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
	  {"name": "fleet", "scope": "cluster", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 9}}]}`)
	s, r := w.open()
	if s.action != engine.Pause {
		t.Fatalf("action %v, want a pause for the call", s.action)
	}
	s.Resp = map[string]string{":status": "504"} // Envoy's own
	r.OnResponseHeaders(true)
	s.Calls[0].Answer(ok(refused))
	if s.Replied != 0 || s.Resumed != 0 {
		t.Fatalf("replied %d, resumed %d for a request Envoy had answered", s.Replied, s.Resumed)
	}
	w.end(s, r)
	if n := w.count("refunds"); n != 0 {
		t.Fatalf("refunds %d: the late refusal refunded a token the response had settled", n)
	}
	w.localHolds("", "", 3) // the 504's reservation back
}

// TestNoRefundOfWhatWasNotTaken (defect 2): the local stack fails open,
// then the limit service rejects; the local bucket must not gain a token.
func TestNoRefundOfWhatWasNotTaken(t *testing.T) {
	h := fakehost.New()
	sd := &fakehost.RefusingData{SD: h.SD}
	h.SD = sd
	w := newWorldOn(t, h, mixed)
	s, r := w.open("k", "a") // takes 1 of local's 3
	s.Calls[0].Answer(ok(admits))
	w.end(s, r)
	sd.Refuse, sd.Err = 1, errors.New("host: shared data unavailable")
	s, r = w.open("k", "a") // local fails open: nothing taken
	s.Calls[0].Answer(ok(refused))
	if w.count("rule.local.failed_open") != 1 || w.count("refunds") != 0 {
		t.Fatalf("failed_open %d, refunds %d; want 1 and 0", w.count("rule.local.failed_open"), w.count("refunds"))
	}
	w.end(s, r)
	w.localHolds("k", "a", 2)
}

// TestShadowClusterRule (defect 5): a shadow cluster rule is decided by the
// limit service and never rejects: beside enforced cluster rules it rides
// in their call; alone it is sent in a call of the plugin's own (its answer
// outlives the request) without pausing the request.
func TestShadowClusterRule(t *testing.T) {
	trial := `{"name": "trial", "mode": "shadow", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 2}}`
	t.Run("alone", func(t *testing.T) {
		w := newWorld(t, `{"service": {"cluster": "limit_service"}, "rules": [`+trial+`]}`)
		s, r := w.open("k", "a")
		if s.action != engine.Continue || len(s.Calls) != 0 || len(w.h.Calls) != 1 {
			t.Fatalf("action %v, %d calls of the request, %d of the plugin; want it to go on, one call of the plugin", s.action, len(s.Calls), len(w.h.Calls))
		}
		if body := string(w.h.Calls[0].Call.Body); !strings.Contains(body, `"shadow":true`) {
			t.Fatalf("call %s, want a shadow bucket", body)
		}
		w.end(s, r) // the request ends before the answer
		w.h.Calls[0].Answer(ok(`{"allowed":true,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":500,"reset_ms":2000}]}`))
		if w.count("rule.trial.shadow_rejected") != 1 || s.Replied != 0 {
			t.Fatalf("shadow_rejected %d, replied %d; want 1, 0", w.count("rule.trial.shadow_rejected"), s.Replied)
		}
	})
	t.Run("beside an enforced rule: one call, only the enforced bucket decides", func(t *testing.T) {
		w := newWorld(t, `{"service": {"cluster": "limit_service"}, "rules": [`+trial+`,
		  {"name": "fleet", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 9}}]}`)
		s, _ := w.open("k", "a")
		if s.action != engine.Pause || len(s.Calls) != 1 || len(w.h.Calls) != 0 {
			t.Fatalf("action %v, %d calls of the request, %d of the plugin; want a pause on one", s.action, len(s.Calls), len(w.h.Calls))
		}
		body := string(s.Calls[0].Call.Body)
		if !strings.HasPrefix(body, `{"buckets":[{"key":"fleet:`) || !strings.Contains(body, `{"key":"trial:`) || strings.Count(body, `"shadow":true`) != 1 {
			t.Fatalf("body %s: want the enforced bucket first, the shadow one after, flagged", body)
		}
		s.Calls[0].Answer(ok(`{"allowed":true,"buckets":[{"allowed":true,"remaining":8,"retry_after_ms":0,"reset_ms":1000},{"allowed":false,"remaining":0,"retry_after_ms":500,"reset_ms":2000}]}`))
		if s.Resumed != 1 || s.Replied != 0 {
			t.Fatalf("resumed %d, replied %d: the shadow bucket's refusal held or rejected the request", s.Resumed, s.Replied)
		}
		if w.count("rule.trial.shadow_rejected") != 1 || w.count("rule.fleet.allowed") != 1 {
			t.Fatalf("shadow_rejected %d, fleet allowed %d; want 1, 1", w.count("rule.trial.shadow_rejected"), w.count("rule.fleet.allowed"))
		}
	})
}

// TestServiceFailuresLogOnceASecond (defect 10): a limit-service outage
// logs one warning a second, however many requests fail.
func TestServiceFailuresLogOnceASecond(t *testing.T) {
	w := newWorld(t, mixed)
	for i := range 300 {
		s, r := w.open("k", strconv.Itoa(i))
		s.Calls[0].Answer(&engine.Answer{Failed: true})
		w.end(s, r)
	}
	w.h.Clock.Advance(sec)
	s, _ := w.open("k", "last")
	s.Calls[0].Answer(&engine.Answer{Failed: true})
	if w.count("service_errors") != 301 || w.h.Warns != 2 || !strings.Contains(w.h.Logs[len(w.h.Logs)-1], "(299 similar lines suppressed)") {
		t.Fatalf("service_errors %d, %d warnings %q: want 301 errors and 2 lines, the second counting 299 suppressed",
			w.count("service_errors"), w.h.Warns, w.h.Logs)
	}
}

// TestClusterResponseCost: a cost known from the response is charged to
// the limit service (a charge call), for per-request and leased cluster
// rules alike (a lease in hand takes the charge, and what it cannot cover
// goes to the global bucket); charge_on refunds through the same call; a
// charge of nothing sends no call; a charge far above what can change a
// bucket is sent clamped to twice the burst (limitd refuses amounts above
// 10^9: the debt would be lost whole).
func TestClusterResponseCost(t *testing.T) {
	fleet := func(sync, alg string) string {
		return `{"service": {"cluster": "limitd", "timeout_ms": 30},
		 "rules": [{"name": "fleet", "scope": "cluster", "sync": "` + sync + `", "limit_keys": ["header:k"],
		   "algorithm": "token_bucket", "algorithm_config": {` + alg + `}}]}`
	}
	usage := func(v string) upstream { return upstream{headers: [][2]string{{"x-usage", v}}} }
	costs30 := []exchange{
		{times: 4, req: []string{"k", "a"}, up: usage("30"), status: 200},
		{times: 2, req: []string{"k", "a"}, up: usage("30"), status: 429},
	}
	const perUsage = `"tokens_per_second": 0.001, "burst": 100, "cost_source": "response_header:x-usage"`
	u := []string{"u", "alice"}
	run(t, []timeline{
		{name: "per_request: costs of 30 against 100", limitd: true, cfg: fleet("per_request", perUsage), steps: costs30,
			metrics: map[string]int64{"service_errors": 0}},
		{name: "lease: costs of 30 against 100", limitd: true, cfg: fleet("lease", perUsage), steps: costs30,
			metrics: map[string]int64{"service_errors": 0}},
		{name: "charge_on 401: 200s give their reservation back", limitd: true,
			cfg: strings.Replace(strings.Replace(fleet("per_request", `"tokens_per_second": 0.001, "burst": 3`), `"header:k"`, `"header:u"`, 1), `"scope"`, `"charge_on": ["401"], "scope"`, 1),
			steps: []exchange{
				{times: 10, req: u, up: upstream{status: "200"}, status: 200},
				{times: 3, req: u, up: upstream{status: "401"}, status: 200},
				{req: u, status: 429}}},
		{name: "no charge call of zero", limitd: true,
			cfg: fleet("per_request", `"tokens_per_second": 1, "burst": 100, "cost_source": "response_header:x-usage", "default_cost": 5`),
			steps: []exchange{
				{req: []string{"k", "a"}, status: 200},                  // no usage reported
				{req: []string{"k", "a"}, up: usage("5"), status: 200}}, // the reservation's
			metrics: map[string]int64{"charge_calls": 0}},
		{name: "a charge clamped", limitd: true,
			cfg: fleet("per_request", `"tokens_per_second": 1, "burst": 100, "cost_source": "response_header:x-usage"`),
			steps: []exchange{
				{req: []string{"k", "a"}, up: usage("2e9"), status: 200},
				{req: []string{"k", "a"}, status: 429}},
			metrics: map[string]int64{"service_errors": 0}},
	})
}
