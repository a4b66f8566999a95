package engine_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// TestShadowRules: a shadow rule decides and counts, but never rejects,
// never adds headers and never stops an enforced rule after it (Envoy's
// shadow descriptors used to stop enforced ones from running).
func TestShadowRules(t *testing.T) {
	run(t, []timeline{
		{name: "shadow first, the enforced rule after it still rejects at its own limit",
			cfg: rules(``,
				limitRule("trial", `, "mode": "shadow", "limit_keys": ["header:k"]`, "1", "2"),
				limitRule("real", `, "limit_keys": ["header:k"]`, "1", "5")),
			steps: []exchange{
				{times: 5, req: []string{"k", "a"}, status: 200},
				{times: 2, req: []string{"k", "a"}, status: 429},
				{req: []string{"k", "b"}, status: 200, headers: map[string]string{"ratelimit": `"real";r=4;t=1`}},
			},
			metrics: map[string]int64{"rule.trial.shadow_rejected": 5}},
		{name: "shadow only: never rejects, adds no header",
			cfg: rules(`"mode": "shadow", `, limitRule("trial", `, "limit_keys": ["header:k"]`, "1", "1")),
			steps: []exchange{
				{times: 5, req: []string{"k", "a"}, status: 200, headers: map[string]string{"ratelimit": "", "ratelimit-remaining": ""}},
			},
			metrics: map[string]int64{"rule.trial.shadow_rejected": 4, "rule.trial.allowed": 1}},
	})
	// The shadow rejection is logged.
	w := newWorld(t, rules(`"mode": "shadow", `, limitRule("trial", `, "limit_keys": ["header:k"]`, "1", "1")))
	w.statuses(2, "k", "a")
	if len(w.h.Logs) == 0 {
		t.Fatal("no log line for the shadow rejection")
	}
}

// TestStackNoPartialConsumption: per-user 3 and global 4. When the global
// rejects, the user's bucket keeps its token. (Peers consume tokens of the
// earlier buckets even when a later one rejects.)
func TestStackNoPartialConsumption(t *testing.T) {
	run(t, []timeline{{name: "user 3, global 4",
		cfg: rules(``,
			limitRule("user", `, "limit_keys": ["header:u"]`, "0.001", "3"),
			limitRule("global", `, "match": {"header:g": {"present": true}}`, "0.001", "4")),
		steps: []exchange{
			{times: 3, req: []string{"u", "a", "g", "1"}, status: 200}, // a: 0 left; global: 1 left
			{req: []string{"u", "b", "g", "1"}, status: 200},           // b: 2 left; global: 0 left
			{times: 3, req: []string{"u", "c", "g", "1"}, status: 429, headers: map[string]string{"ratelimit": `"global";r=0;t=1000`}},
			// Without header g only the user rule applies: c's bucket is untouched.
			{req: []string{"u", "c"}, status: 200, headers: map[string]string{"ratelimit-remaining": "2"}},
			{req: []string{"u", "b", "g", "1"}, status: 429, headers: map[string]string{"ratelimit": `"global";r=0;t=1000`}},
		}}})
}

// TestTiers: the members of a group are a tier; the first that applies
// counts, for every kind of member (defect 1: a member that matched but
// lacked its key exempted the request from the whole tier); an allow rule
// exempts the request from the rules after it.
func TestTiers(t *testing.T) {
	plans := rules(``,
		limitRule("enterprise", `, "group": "plan", "match": {"header:x-plan": {"equals": "enterprise"}}, "limit_keys": ["header:k"]`, "1", "10"),
		limitRule("pro", `, "group": "plan", "match": {"header:x-plan": {"in": ["pro", "team"]}}, "limit_keys": ["header:k"]`, "1", "5"),
		limitRule("free", `, "group": "plan", "limit_keys": ["header:k"]`, "1", "2"))
	// fallback limits every request by header k with burst 2, after member.
	fallback := limitRule("fallback", `, "group": "plan", "limit_keys": ["header:k"]`, "0.001", "2")
	tier := func(member string) string { return rules(``, member, fallback) }
	gold := func(extra string) string {
		return limitRule("gold", `, "group": "plan"`+extra+`, "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "3")
	}
	ok, no, bad := exchange{req: []string{"x-plan", "gold", "k", "1"}, status: 200}, exchange{req: []string{"x-plan", "gold", "k", "1"}, status: 429}, exchange{req: []string{"x-plan", "gold", "k", "1"}, status: 400}
	withSub := func(e exchange, n int) exchange {
		e.req, e.times = []string{"x-plan", "gold", "sub", "a", "k", "1"}, n
		return e
	}
	times := func(e exchange, n int) exchange { e.times = n; return e }
	run(t, []timeline{
		{name: "first match wins: enterprise", cfg: plans, steps: []exchange{
			{times: 10, req: []string{"k", "e", "x-plan", "enterprise"}, status: 200}, {req: []string{"k", "e", "x-plan", "enterprise"}, status: 429}}},
		{name: "first match wins: team is pro", cfg: plans, steps: []exchange{
			{times: 5, req: []string{"k", "t", "x-plan", "team"}, status: 200}, {req: []string{"k", "t", "x-plan", "team"}, status: 429}}},
		{name: "first match wins: no plan is free", cfg: plans, steps: []exchange{
			{times: 2, req: []string{"k", "f"}, status: 200}, {req: []string{"k", "f"}, status: 429}}},
		{name: "first match wins: another plan is free", cfg: plans, steps: []exchange{
			{times: 2, req: []string{"k", "o", "x-plan", "other"}, status: 200}, {req: []string{"k", "o", "x-plan", "other"}, status: 429}}},
		{name: "member matches, key present: it counts", cfg: tier(gold(``)),
			steps: []exchange{withSub(ok, 3), withSub(no, 1)}},
		{name: "member matches, key missing, skip: the next member counts", cfg: tier(gold(``)),
			steps: []exchange{times(ok, 2), times(no, 2)}},
		{name: "member matches, key missing, shared: its shared bucket counts", cfg: tier(gold(`, "missing_key": "shared"`)),
			steps: []exchange{times(ok, 3), no}},
		{name: "member matches, key missing, deny: it rejects", cfg: tier(gold(`, "missing_key": "deny"`)),
			steps: []exchange{times(bad, 4)}},
		{name: "member does not match: the next member counts", cfg: tier(gold(``)),
			steps: []exchange{{times: 2, req: []string{"x-plan", "silver", "sub", "a", "k", "1"}, status: 200}, {times: 2, req: []string{"x-plan", "silver", "sub", "a", "k", "1"}, status: 429}}},
		{name: "an allow member that matches: exempt",
			cfg:   tier(`{"name": "staff", "action": "allow", "group": "plan", "match": {"header:x-plan": {"equals": "staff"}}}`),
			steps: []exchange{{times: 4, req: []string{"x-plan", "staff", "k", "1"}, status: 200}}},
		{name: "a shadow member applies: the tier is its, never rejecting",
			cfg:   tier(limitRule("gold", `, "mode": "shadow", "group": "plan", "match": {"header:x-plan": {"equals": "gold"}}, "limit_keys": ["header:sub"]`, "0.001", "1")),
			steps: []exchange{withSub(ok, 4)}},
		// The attack on examples/tiers-by-plan: an enterprise token without
		// the key the enterprise member needs must not pass unlimited.
		{name: "tiers-by-plan: enterprise without sub is free",
			cfg: rules(``,
				limitRule("enterprise", `, "group": "plan", "match": {"header:x-plan": {"equals": "enterprise"}}, "limit_keys": ["header:sub"]`, "0.001", "100"),
				limitRule("free", `, "group": "plan", "limit_keys": ["ip:address"]`, "0.001", "5")),
			steps: []exchange{{times: 5, req: []string{"x-plan", "enterprise"}, status: 200}, {times: 15, req: []string{"x-plan", "enterprise"}, status: 429}}},
		{name: "an allow rule exempts the rules after it",
			cfg: rules(``,
				`{"name": "internal", "action": "allow", "match": {"header:x-internal": {"present": true}}}`,
				limitRule("per-key", `, "limit_keys": ["header:k"]`, "1", "1")),
			steps: []exchange{
				{times: 5, req: []string{"k", "a", "x-internal", "1"}, status: 200, headers: map[string]string{"ratelimit": ""}},
				{req: []string{"k", "a"}, status: 200}, {times: 2, req: []string{"k", "a"}, status: 429}}},
	})
}

// TestMatchConditions: a rule applies when all its conditions hold; a
// regex reads at most RegexMaxInput bytes of a value (defect 7): a longer
// one does not match, and is counted.
func TestMatchConditions(t *testing.T) {
	api := rules(``, limitRule("api", `, "match": {"path": {"prefix": "/api/"}, "method": {"in": ["POST"]},
	  "header:x-debug": {"present": false}, "authority": {"regex": "^api\\.example\\.com$"}}`, "1", "1"))
	base := []string{":path", "/api/x", ":method", "POST", ":authority", "api.example.com"}
	applies := func(name string, hs ...string) timeline {
		return timeline{name: name, cfg: api, steps: []exchange{{req: append(hs, base...), status: 200}, {req: append(hs, base...), status: 429}}}
	}
	notApplies := func(name string, hs ...string) timeline {
		req := append(append([]string{}, base...), hs...)
		return timeline{name: name, cfg: api, steps: []exchange{{times: 2, req: req, status: 200, headers: map[string]string{"ratelimit": ""}}}}
	}
	hex := rules(``, limitRule("hex", `, "match": {"header:x-id": {"regex": "[0-9a-f]{64}"}}`, "0.001", "1"))
	attack := strings.Repeat(strings.Repeat("a", 63)+"!", 1000) // 64 000 bytes
	run(t, []timeline{
		applies("all conditions hold"),
		notApplies("debug header", "x-debug", "1"),
		notApplies("GET", ":method", "GET"),
		notApplies("path", ":path", "/other"),
		notApplies("host", ":authority", "x.example.com"),
		{name: "regex: a matching value", cfg: hex, steps: []exchange{
			{req: []string{"x-id", strings.Repeat("a", 64)}, status: 200}, {req: []string{"x-id", strings.Repeat("a", 64)}, status: 429}}},
		{name: "regex: a 64 KB value does not match", cfg: hex,
			steps:   []exchange{{times: 3, req: []string{"x-id", attack}, status: 200}},
			metrics: map[string]int64{"regex_value_too_long": 3}},
	})
}

// TestMissingKey: a request without a rule's key is skipped, shares one
// bucket, or is refused (400, missing_limit_key), as missing_key says.
func TestMissingKey(t *testing.T) {
	cfg := func(mode string) string {
		return rules(``, limitRule("k", `, "missing_key": "`+mode+`", "limit_keys": ["header:k"]`, "0.001", "2"))
	}
	run(t, []timeline{
		{name: "skip", cfg: cfg("skip"), steps: []exchange{{times: 3, status: 200}}},
		{name: "shared", cfg: cfg("shared"), steps: []exchange{{times: 2, status: 200}, {status: 429}}},
		{name: "deny", cfg: cfg("deny"), steps: []exchange{{times: 3, status: 400, headers: map[string]string{"x-ratelimit-reason": "missing_limit_key"}}}},
	})
}

// TestFailOpen: shared data the host cannot give: every request goes on,
// counted in failed_open.
func TestFailOpen(t *testing.T) {
	h := fakehost.New()
	h.SD = brokenData{}
	w := newWorldOn(t, h, perKey)
	for i := range 10 {
		if r := w.do("x-api-key", "a"); r.status != 200 {
			t.Fatalf("request %d: %d, want 200 (fail open)", i, r.status)
		}
	}
	if got := w.count("rule.per-key.failed_open"); got != 10 {
		t.Fatalf("failed_open = %d, want 10", got)
	}
}

// brokenData fails every call, as a host whose shared data is unavailable.
type brokenData struct{}

func (brokenData) Get(string) ([]byte, uint32, error) { return nil, 0, errors.New("host: broken") }
func (brokenData) Set(string, []byte, uint32) error   { return errors.New("host: broken") }
