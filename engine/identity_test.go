package engine_test

import (
	"encoding/base64"
	"strings"
	"testing"
)

// bearer is an unsigned JWT whose payload is payload.
func bearer(payload string) string {
	return "Bearer e30." + base64.RawURLEncoding.EncodeToString([]byte(payload)) + ".sig"
}

// TestIdentitySources: each limit key source reads the identity as the
// upstream would, so that requests of one identity share a bucket (burst 1)
// and another identity has its own; what the client can forge is no
// identity.
func TestIdentitySources(t *testing.T) {
	one := func(key, top string) string {
		return rules(top, limitRule("r", `, "limit_keys": ["`+key+`"]`, "0.001", "1"))
	}
	// same: two requests of one identity, then one of another (other) that
	// has a bucket of its own (wantOther 200) or not (429).
	same := func(name, key, top string, req, other []string, wantOther int) timeline {
		return timeline{name: name, cfg: one(key, top), steps: []exchange{
			{req: req, status: 200}, {req: req, status: 429}, {req: other, status: wantOther}}}
	}
	long := strings.Repeat("x", 1<<20)
	deep := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	verified := map[string]string{"metadata.filter_metadata.envoy.filters.http.jwt_authn.jwt_payload.sub": "alice"}
	table := []timeline{
		same("cookie", "cookie:session", ``, []string{"cookie", "a=1; session=xyz"}, []string{"cookie", "session=abc"}, 200),
		same("authority", "authority", ``, []string{":authority", "one"}, []string{":authority", "two"}, 200),
		same("query", "query:user", ``, []string{":path", "/p?x=1&user=a%20b"}, []string{":path", "/p?user=c"}, 200),
		same("method", "method", ``, []string{":method", "PUT"}, []string{":method", "GET"}, 200),
		same("path", "path", ``, []string{":path", "/a?x=1"}, []string{":path", "/b"}, 200),
		// the rightmost entry is the peer Envoy appended (use_remote_address)
		same("xff hop", "ip:address", `"xff_num_trusted_hops": 1, `,
			[]string{"x-forwarded-for", "6.6.6.6, 1.1.1.1, 10.0.0.9"}, []string{"x-forwarded-for", "1.1.1.1, 8.8.8.8, 10.0.0.9"}, 200),
		// without trusted hops the address is the peer's: X-Forwarded-For is
		// the client's to forge
		same("spoofed X-Forwarded-For", "ip:address", ``,
			[]string{"x-forwarded-for", "192.0.2.0"}, []string{"x-forwarded-for", "198.51.100.7"}, 429),
		same("unverified jwt", "jwt:org.id", `"trust_unverified_jwt": true, `,
			[]string{"authorization", bearer(`{"org":{"id":"acme"}}`)}, []string{"authorization", bearer(`{"org":{"id":"other"}}`)}, 200),
		// the verified claim (Envoy's jwt_authn metadata) is alice's for every
		// request; the unverified token is ignored
		{name: "verified jwt", cfg: one("jwt:sub", ``), props: verified, steps: []exchange{
			{req: []string{"authorization", bearer(`{"sub":"forged"}`)}, status: 200},
			{req: []string{"authorization", bearer(`{"sub":"forged"}`)}, status: 429},
			{req: []string{"x-unused", "1"}, status: 429}}},
		{name: "an unverified jwt is not trusted by default", cfg: one("jwt:sub", ``), steps: []exchange{
			{times: 3, req: []string{"authorization", bearer(`{"sub":"mallory"}`)}, status: 200, headers: map[string]string{"ratelimit": ""}}}},
		// defect 6: a payload nested 10,000 deep is no key (the rule is
		// skipped), and the next request is decided as usual (in a Wasm VM
		// the recursive validator ran out of stack on it)
		{name: "a deep unverified token", cfg: one("jwt:sub", `"trust_unverified_jwt": true, `), steps: []exchange{
			{times: 3, req: []string{"authorization", bearer(deep)}, status: 200},
			{req: []string{"authorization", bearer(`{"sub":"alice"}`)}, status: 200},
			{req: []string{"authorization", bearer(`{"sub":"alice"}`)}, status: 429}}},
		same("a 1 MiB value, another one", "header:k", ``, []string{"k", long}, []string{"k", long[:len(long)-1] + "y"}, 200),
	}
	// defect 8: the cookie of every Cookie header, names trimmed, is the
	// cookie the upstream sees
	for name, hs := range map[string][]string{
		"cookie: space before =":       {"cookie", "sid =victim"},
		"cookie: tab and quotes":       {"cookie", "a=1;\tsid\t=\"victim\""},
		"cookie: second Cookie header": {"cookie", "theme=dark", "cookie", "sid=victim"},
	} {
		table = append(table, timeline{name: name, cfg: rules(``, limitRule("session", `, "limit_keys": ["cookie:sid"]`, "0.001", "2")),
			steps: []exchange{{times: 2, req: []string{"cookie", "sid=victim"}, status: 200}, {req: hs, status: 429}}})
	}
	run(t, table)
}

// TestRequestCost: a cost from a request header is charged; one that is
// not a number, not positive or below config.MinCost (defect 11: 1e-300 as
// much as 0) is no cost, and default_cost is charged; a cost above the
// burst is refused without touching the bucket.
func TestRequestCost(t *testing.T) {
	cost := func(v, remaining string) exchange {
		return exchange{wait: 10 * sec, req: []string{"x-api-key", "a", "x-cost", v}, status: 200, headers: map[string]string{"ratelimit-remaining": remaining}}
	}
	steps := []exchange{cost("3", "1")}
	for _, bad := range []string{"", "abc", "NaN", "-1", "0", "Inf", "1e400", "1e-300", "-0", "0.0009", "5e-324"} {
		steps = append(steps, cost(bad, "3")) // default cost
	}
	steps = append(steps,
		cost("0.001", "3"), // the minimum: floor of 3.999
		cost("0.5", "3"),   // floor of 3.5
		exchange{req: []string{"x-api-key", "a", "x-cost", "5"}, status: 429,
			headers: map[string]string{"x-ratelimit-reason": "cost_exceeds_burst", "retry-after": ""}},
		exchange{req: []string{"x-api-key", "a"}, status: 200, headers: map[string]string{"ratelimit-remaining": "2"}}, // bucket untouched
	)
	run(t, []timeline{{name: "burst 4, default_cost 1", cfg: perKey, steps: steps}})
}
