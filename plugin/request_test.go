package plugin

import (
	"encoding/base64"
	"strings"
	"testing"
)

// TestDeepUnverifiedToken (defect 6): a bearer token whose payload is JSON
// nested 10,000 deep is no key (the rule is skipped), and the next request
// is decided as usual. In a Wasm VM the recursive validator ran out of stack
// on it; see also TestWasmDeepToken.
func TestDeepUnverifiedToken(t *testing.T) {
	e := start(t, rules(`"trust_unverified_jwt": true, `, limitRule("r", `, "limit_keys": ["jwt:sub"]`, "0.001", "1")))
	deep := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	tok := "Bearer e30." + base64.RawURLEncoding.EncodeToString([]byte(deep)) + ".x"
	if st := e.statuses(3, "authorization", tok); count(st, 200) != 3 {
		t.Fatalf("deep token: %v, want the rule skipped", st)
	}
	ok := "Bearer e30." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"alice"}`)) + ".x"
	if st := e.statuses(2, "authorization", ok); st[0] != 200 || st[1] != 429 {
		t.Fatalf("a normal token after the deep one: %v", st)
	}
}

// TestRegexReadsBoundedInput (defect 7): a regex condition reads at most
// RegexMaxInput bytes; a longer value does not match and is counted.
func TestRegexReadsBoundedInput(t *testing.T) {
	e := start(t, rules(``, limitRule("hex", `, "match": {"header:x-id": {"regex": "[0-9a-f]{64}"}}`, "0.001", "1")))
	id := strings.Repeat("a", 64)
	if st := e.statuses(2, "x-id", id); st[1] != 429 {
		t.Fatalf("a matching value: %v, want the rule to apply", st)
	}
	attack := strings.Repeat(strings.Repeat("a", 63)+"!", 1000) // 64 000 bytes
	if st := e.statuses(3, "x-id", attack); count(st, 200) != 3 {
		t.Fatalf("a 64 KB value: %v, want no match", st)
	}
	if got := e.counter("regex_value_too_long"); got != 3 {
		t.Fatalf("regex_value_too_long = %d, want 3", got)
	}
}

// TestCookieAsUpstreamsReadIt (defect 8): the cookie of every Cookie header,
// names trimmed, is the cookie the upstream sees.
func TestCookieAsUpstreamsReadIt(t *testing.T) {
	e := start(t, rules(``, limitRule("session", `, "limit_keys": ["cookie:sid"]`, "0.001", "2")))
	e.statuses(2, "cookie", "sid=victim") // exhausted
	for name, hs := range map[string][][2]string{
		"space before =":       {{"cookie", "sid =victim"}},
		"tab and quotes":       {{"cookie", "a=1;\tsid\t=\"victim\""}},
		"second Cookie header": {{"cookie", "theme=dark"}, {"cookie", "sid=victim"}},
	} {
		id := e.host.InitializeHttpContext()
		base := [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "example"}}
		e.host.CallOnRequestHeaders(id, append(base, hs...), false)
		lr := e.host.GetSentLocalResponse(id)
		if lr == nil || lr.StatusCode != 429 {
			t.Errorf("%s: not limited as sid=victim (reply %+v)", name, lr)
		}
		e.host.CompleteHttpContext(id)
	}
}

// TestTinyCostIsNoCost (defect 11): a cost below config.MinCost, 1e-300 as
// much as 0, is not a cost: default_cost is charged.
func TestTinyCostIsNoCost(t *testing.T) {
	e := start(t, perKey) // burst 4, default_cost 1
	for _, v := range []string{"1e-300", "0", "-0", "0.0009", "5e-324"} {
		e.clk.t += 10 * sec
		if r := e.do("x-api-key", "a", "x-cost", v); r.headers["ratelimit-remaining"] != "3" {
			t.Errorf("cost %s: remaining %q, want 3 (default cost)", v, r.headers["ratelimit-remaining"])
		}
	}
	e.clk.t += 10 * sec
	if r := e.do("x-api-key", "a", "x-cost", "0.001"); r.headers["ratelimit-remaining"] != "3" {
		t.Errorf("cost 0.001 (the minimum): remaining %q, want 3 (floor of 3.999)", r.headers["ratelimit-remaining"])
	}
}
