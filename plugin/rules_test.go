package plugin

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
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

// TestShadowNeverStopsEnforced: a shadow rule that would reject comes first;
// the enforced rule after it still runs and rejects at its own limit, the
// shadow rule adds no header and counts what it would have rejected.
// (Envoy's shadow descriptors used to stop enforced ones from running.)
func TestShadowNeverStopsEnforced(t *testing.T) {
	e := start(t, rules(``,
		limitRule("trial", `, "mode": "shadow", "limit_keys": ["header:k"]`, "1", "2"),
		limitRule("real", `, "limit_keys": ["header:k"]`, "1", "5")))
	sts := e.statuses(7, "k", "a")
	if count(sts, 200) != 5 || count(sts, 429) != 2 {
		t.Fatalf("statuses %v: want 5 admitted by the enforced rule", sts)
	}
	if got := e.counter("rule.trial.shadow_rejected"); got != 5 {
		t.Fatalf("shadow_rejected = %d, want 5", got)
	}
	r := e.do("k", "b")
	if !strings.Contains(r.headers["ratelimit"], `"real"`) {
		t.Fatalf("headers name %q, want only the enforced rule", r.headers["ratelimit"])
	}
	if n := len(e.host.GetInfoLogs()); n == 0 {
		t.Fatal("no info log for the shadow rejection")
	}
}

func TestShadowOnlyNeverRejects(t *testing.T) {
	e := start(t, rules(`"mode": "shadow", `, limitRule("trial", `, "limit_keys": ["header:k"]`, "1", "1")))
	for _, st := range e.statuses(5, "k", "a") {
		if st != 200 {
			t.Fatalf("a shadow rule rejected: %d", st)
		}
	}
	if r := e.do("k", "a"); r.headers["ratelimit"] != "" {
		t.Fatalf("a shadow rule added headers: %v", r.headers)
	}
}

// TestStackNoPartialConsumption: per-user 3 and global 4. When the global
// rejects, the user's bucket keeps its token. (Peers consume tokens of the
// earlier buckets even when a later one rejects.)
func TestStackNoPartialConsumption(t *testing.T) {
	e := start(t, rules(``,
		limitRule("user", `, "limit_keys": ["header:u"]`, "0.001", "3"),
		limitRule("global", `, "match": {"header:g": {"present": true}}`, "0.001", "4")))
	e.statuses(3, "u", "a", "g", "1") // a: 0 left; global: 1 left
	e.do("u", "b", "g", "1")          // b: 2 left; global: 0 left
	for i := 0; i < 3; i++ {
		r := e.do("u", "c", "g", "1")
		if r.status != 429 || r.headers["ratelimit"] != `"global";r=0;t=1000` {
			t.Fatalf("global exhausted: %d %q", r.status, r.headers["ratelimit"])
		}
	}
	// Without header g only the user rule applies: c's bucket is untouched.
	if r := e.do("u", "c"); r.status != 200 || r.headers["ratelimit-remaining"] != "2" {
		t.Fatalf("user c: %d remaining %q, want 200 and 2 (3 − this request): the rejections took tokens", r.status, r.headers["ratelimit-remaining"])
	}
	if r := e.do("u", "b", "g", "1"); r.headers["ratelimit"] != `"global";r=0;t=1000` {
		t.Fatalf("rejection names %q, want the global rule", r.headers["ratelimit"])
	}
}

func TestTiersFirstMatchWins(t *testing.T) {
	e := start(t, rules(``,
		limitRule("enterprise", `, "group": "plan", "match": {"header:x-plan": {"equals": "enterprise"}}, "limit_keys": ["header:k"]`, "1", "10"),
		limitRule("pro", `, "group": "plan", "match": {"header:x-plan": {"in": ["pro", "team"]}}, "limit_keys": ["header:k"]`, "1", "5"),
		limitRule("free", `, "group": "plan", "limit_keys": ["header:k"]`, "1", "2")))
	for plan, want := range map[string]int{"enterprise": 10, "team": 5, "": 2, "other": 2} {
		e.clk.t += 1000 * sec
		hs := []string{"k", "tier-" + plan}
		if plan != "" {
			hs = append(hs, "x-plan", plan)
		}
		if got := count(e.statuses(12, hs...), 200); got != want {
			t.Errorf("plan %q: %d admitted, want %d", plan, got, want)
		}
	}
}

func TestAllowListExemptsLaterRules(t *testing.T) {
	e := start(t, rules(``,
		`{"name": "internal", "action": "allow", "match": {"header:x-internal": {"present": true}}}`,
		limitRule("per-key", `, "limit_keys": ["header:k"]`, "1", "1")))
	if got := count(e.statuses(5, "k", "a", "x-internal", "1"), 200); got != 5 {
		t.Fatalf("allow-listed: %d of 5 admitted", got)
	}
	if got := count(e.statuses(3, "k", "a"), 200); got != 1 {
		t.Fatalf("not allow-listed: %d of 3 admitted, want 1", got)
	}
}

func TestMatchConditions(t *testing.T) {
	e := start(t, rules(``, limitRule("api", `, "match": {"path": {"prefix": "/api/"}, "method": {"in": ["POST"]},
	  "header:x-debug": {"present": false}, "authority": {"regex": "^api\\.example\\.com$"}}`, "1", "1")))
	base := func(extra ...string) []int {
		return e.statuses(2, append([]string{":path", "/api/x", ":method", "POST", ":authority", "api.example.com"}, extra...)...)
	}
	if got := base(); got[1] != 429 {
		t.Fatalf("all conditions hold: %v, want the second rejected", got)
	}
	for name, hs := range map[string][]string{
		"debug header": {"x-debug", "1"}, "GET": {":method", "GET"}, "path": {":path", "/other"}, "host": {":authority", "x.example.com"},
	} {
		if got := base(hs...); got[1] != 200 {
			t.Errorf("%s: %v, want the rule not to apply", name, got)
		}
	}
}

func TestMissingKey(t *testing.T) {
	for mode, want := range map[string][]int{
		"skip": {200, 200, 200}, "shared": {200, 200, 429}, "deny": {400, 400, 400},
	} {
		t.Run(mode, func(t *testing.T) {
			e := start(t, rules(``, limitRule("k", `, "missing_key": "`+mode+`", "limit_keys": ["header:k"]`, "0.001", "2")))
			got := e.statuses(3)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("statuses %v, want %v", got, want)
				}
			}
			if mode == "deny" {
				if r := e.do(); r.headers["x-ratelimit-reason"] != "missing_limit_key" {
					t.Fatalf("deny reason %q", r.headers["x-ratelimit-reason"])
				}
			}
		})
	}
}

func TestCustomResponseAndHeaderStyles(t *testing.T) {
	e := start(t, rules(`"headers": "legacy", `, limitRule("k", `, "status": 503, "body": "slow down",
	  "response_headers": {"x-team": "payments"}, "limit_keys": ["header:k"]`, "1", "1")))
	ok := e.do("k", "a")
	if ok.headers["ratelimit-limit"] != "1" || ok.headers["ratelimit"] != "" || ok.headers["ratelimit-policy"] != "" {
		t.Fatalf("legacy style: %v", ok.headers)
	}
	r := e.do("k", "a")
	if r.status != 503 || r.body != "slow down" || r.headers["x-team"] != "payments" {
		t.Fatalf("custom rejection: %d %q %v", r.status, r.body, r.headers)
	}
}

func TestHeaderStyleNone(t *testing.T) {
	e := start(t, rules(`"headers": "none", `, limitRule("k", `, "limit_keys": ["header:k"]`, "1", "1")))
	if r := e.do("k", "a"); len(r.headers) != 0 {
		t.Fatalf("style none added %v", r.headers)
	}
	if r := e.do("k", "a"); r.status != 429 || r.headers["retry-after"] == "" || r.headers["ratelimit"] != "" {
		t.Fatalf("style none rejection: %d %v (Retry-After stays, RateLimit headers go)", r.status, r.headers)
	}
}

func TestIdentitySources(t *testing.T) {
	jwt := func(payload string) string {
		return "Bearer e30." + base64.RawURLEncoding.EncodeToString([]byte(payload)) + ".sig"
	}
	cases := []struct {
		name, key, top string
		same, other    []string // headers of two requests that must share / not share a bucket
		opts           []func(*proxytest.EmulatorOption, *vmContext)
	}{
		{name: "cookie", key: "cookie:session", same: []string{"cookie", "a=1; session=xyz"}, other: []string{"cookie", "session=abc"}},
		{name: "authority", key: "authority", same: []string{":authority", "one"}, other: []string{":authority", "two"}},
		{name: "query", key: "query:user", same: []string{":path", "/p?x=1&user=a%20b"}, other: []string{":path", "/p?user=c"}},
		{name: "method", key: "method", same: []string{":method", "PUT"}, other: []string{":method", "GET"}},
		{name: "path", key: "path", same: []string{":path", "/a?x=1"}, other: []string{":path", "/b"}},
		{name: "xff hop", key: "ip:address", top: `"xff_num_trusted_hops": 1, `,
			// the rightmost entry is the peer Envoy appended (use_remote_address)
			same: []string{"x-forwarded-for", "6.6.6.6, 1.1.1.1, 10.0.0.9"}, other: []string{"x-forwarded-for", "1.1.1.1, 8.8.8.8, 10.0.0.9"}},
		{name: "unverified jwt", key: "jwt:org.id", top: `"trust_unverified_jwt": true, `,
			same: []string{"authorization", jwt(`{"org":{"id":"acme"}}`)}, other: []string{"authorization", jwt(`{"org":{"id":"other"}}`)}},
		{name: "verified jwt", key: "jwt:sub",
			same:  []string{"authorization", jwt(`{"sub":"forged"}`)}, // ignored: not trusted
			other: []string{"x-unused", "1"},
			opts: []func(*proxytest.EmulatorOption, *vmContext){func(o *proxytest.EmulatorOption, _ *vmContext) {
				o.WithProperty([]string{"metadata", "filter_metadata", "envoy.filters.http.jwt_authn", "jwt_payload", "sub"}, []byte("alice"))
			}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := start(t, rules(c.top, limitRule("r", `, "limit_keys": ["`+c.key+`"]`, "0.001", "1")), c.opts...)
			if st := e.statuses(2, c.same...); st[0] != 200 || st[1] != 429 {
				t.Fatalf("same identity: %v, want 200 then 429", st)
			}
			want := 200
			if c.name == "verified jwt" {
				want = 429 // the verified claim is the same for every request here
			}
			if st := e.do(c.other...).status; st != want {
				t.Fatalf("other identity: %d, want %d", st, want)
			}
		})
	}
}

func TestUnverifiedJWTNotTrustedByDefault(t *testing.T) {
	e := start(t, rules(``, limitRule("r", `, "limit_keys": ["jwt:sub"]`, "0.001", "1")))
	tok := "Bearer e30." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"mallory"}`)) + ".x"
	if st := e.statuses(3, "authorization", tok); count(st, 200) != 3 {
		t.Fatalf("an unverified token became a key: %v (the rule must be skipped)", st)
	}
}

func TestLongValuesBounded(t *testing.T) {
	e := start(t, rules(``, limitRule("r", `, "limit_keys": ["header:k"]`, "0.001", "1")))
	long := strings.Repeat("x", 1<<20)
	if st := e.statuses(2, "k", long); st[0] != 200 || st[1] != 429 {
		t.Fatalf("1 MiB key: %v", st)
	}
	if st := e.do("k", long[:len(long)-1]+"y").status; st != 200 {
		t.Fatalf("a different 1 MiB key shares the bucket: %d", st)
	}
}

// TestTierMembers pins which member of a tier counts, for every kind of
// member (defect 1: a member that matched but lacked its key exempted the
// request from the whole tier). The tier is "plan"; "fallback" limits every
// request by header k with burst 2.
func TestTierMembers(t *testing.T) {
	fallback := limitRule("fallback", `, "group": "plan", "limit_keys": ["header:k"]`, "0.001", "2")
	cases := []struct {
		name   string
		member string // the first member of the tier
		hs     []string
		want   []int // statuses of four requests
	}{
		{"matches, key present: it counts", limitRule("gold", `, "group": "plan", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "3"),
			[]string{"x-plan", "gold", "sub", "a", "k", "1"}, []int{200, 200, 200, 429}},
		{"matches, key missing, skip: the next member counts", limitRule("gold", `, "group": "plan", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "3"),
			[]string{"x-plan", "gold", "k", "1"}, []int{200, 200, 429, 429}},
		{"matches, key missing, shared: its shared bucket counts", limitRule("gold", `, "group": "plan", "missing_key": "shared", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "3"),
			[]string{"x-plan", "gold", "k", "1"}, []int{200, 200, 200, 429}},
		{"matches, key missing, deny: it rejects", limitRule("gold", `, "group": "plan", "missing_key": "deny", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "3"),
			[]string{"x-plan", "gold", "k", "1"}, []int{400, 400, 400, 400}},
		{"does not match: the next member counts", limitRule("gold", `, "group": "plan", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "3"),
			[]string{"x-plan", "silver", "sub", "a", "k", "1"}, []int{200, 200, 429, 429}},
		{"an allow member that matches: exempt", `{"name": "staff", "action": "allow", "group": "plan", "match": {"header:x-plan": {"equals": "staff"}}}`,
			[]string{"x-plan", "staff", "k", "1"}, []int{200, 200, 200, 200}},
		{"a shadow member applies: the tier is its, never rejecting", limitRule("gold", `, "mode": "shadow", "group": "plan", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "1"),
			[]string{"x-plan", "gold", "sub", "a", "k", "1"}, []int{200, 200, 200, 200}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := start(t, rules(``, c.member, fallback))
			got := e.statuses(4, c.hs...)
			for i := range c.want {
				if got[i] != c.want[i] {
					t.Fatalf("statuses %v, want %v", got, c.want)
				}
			}
		})
	}
}

// TestTiersByPlanExample is the attack on examples/tiers-by-plan: an
// enterprise token without the key the enterprise member needs must not pass
// unlimited.
func TestTiersByPlanExample(t *testing.T) {
	e := start(t, rules(``,
		limitRule("enterprise", `, "group": "plan", "match": {"header:x-plan": {"equals": "enterprise"}}, "limit_keys": ["header:sub"]`, "0.001", "100"),
		limitRule("free", `, "group": "plan", "limit_keys": ["ip:address"]`, "0.001", "5")))
	if got := count(e.statuses(20, "x-plan", "enterprise"), 200); got != 5 {
		t.Fatalf("enterprise plan without sub: %d of 20 admitted, want the free tier's 5", got)
	}
}
