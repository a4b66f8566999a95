package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// okAlg is a valid algorithm for rules whose test is about something else.
const okAlg = `"algorithm":"token_bucket","algorithm_config":{"tokens_per_second":10,"burst":50}`

// doc builds a configuration from top-level fields (may be empty) and rules.
func doc(top string, rules ...string) string {
	if top != "" {
		top += ","
	}
	return `{` + top + `"rules":[` + strings.Join(rules, ",") + `]}`
}

// rule is a limit rule named r with extra fields and a valid algorithm.
func rule(extra string) string {
	if extra != "" {
		extra += ","
	}
	return `{"name":"r",` + extra + okAlg + `}`
}

// alg is a rule named r whose algorithm_config holds fields.
func alg(fields string) string {
	return `{"name":"r","algorithm":"token_bucket","algorithm_config":{` + fields + `}}`
}

// badCase is a configuration Parse must refuse with exactly want. gap, when
// set, says why schema.json cannot refuse it too (schema_test.go checks that
// it accepts those and refuses the rest).
type badCase struct {
	name string
	in   string
	want string
	gap  string
}

const (
	gapDuplicate = "duplicate object keys: the schema sees only the last"
	gapUTF8      = "the schema validator decodes invalid UTF-8 to U+FFFD"
	gapCase      = "header names are compared after lower-casing"
	gapRelation  = "relations between numbers are not expressible"
	gapUnique    = "uniqueness of a field across array items is not expressible"
	gapRegex     = "the schema does not assert format regex (and RE2 is not ECMA 262)"
	gapCount     = "counting items across rules is not expressible"
	gapClass     = "a status inside a class listed elsewhere in the array is not expressible"
	gapLength    = "the length of a part of a string is not expressible"
)

const svc = `"service":{"cluster":"c"}`

func manyRules(n int, extra string) []string {
	rs := make([]string, n)
	for i := range rs {
		rs[i] = `{"name":"r` + strings.Repeat("x", i) + `",` + extra + okAlg + `}`
	}
	return rs
}

var badCases = []badCase{
	// Hostile input: bounded before any recursive parser sees it.
	{name: "nested 100000 deep", in: doc(`"x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000)), want: `config: x[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]: nested deeper than 32 levels`},
	{name: "regex too large", in: doc("", rule(`"match":{"header:x":{"regex":"[a-z]{1000}"}}`)), want: `config: rules[0].match["header:x"].regex: compiles to 1002 instructions, more than 100: it could read only 16 bytes of a value (see RegexBudget); use a shorter pattern or a prefix/in condition`, gap: gapRegex},
	{name: "too many regexes", in: doc("", manyRules(9, `"match":{"header:x":{"regex":"a"}},`)...), want: `config: rules[8].match["header:x"].regex: at most 8 regex conditions in a configuration (each costs a request up to 16384 steps)`, gap: gapCount},
	{name: "fixed_cost below MinCost", in: doc("", alg(`"tokens_per_second":1,"burst":1,"fixed_cost":1e-300`)), want: `config: rules[0].algorithm_config.fixed_cost: must be at least 0.001 (MinCost), got 1e-300`},
	{name: "default_cost below MinCost", in: doc("", alg(`"tokens_per_second":1,"burst":1,"default_cost":0.0005`)), want: `config: rules[0].algorithm_config.default_cost: must be at least 0.001 (MinCost), got 0.0005`},
	// Costs known from the response, and charge_on.
	{name: "cost_source unknown kind", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"body:x"`)), want: `config: rules[0].algorithm_config.cost_source: must be "fixed", header:<name>, query:<name>, response_header:<name> or response_json:<path>, got "body:x"`},
	{name: "response_header without a name", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_header:"`)), want: `config: rules[0].algorithm_config.cost_source: source "response_header:": header name must be a non-empty HTTP token (letters, digits and !#$%&'*+-.^_` + "`" + `|~)`},
	{name: "response_header pseudo-header", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_header::status"`)), want: `config: rules[0].algorithm_config.cost_source: source "response_header::status": pseudo-headers are not allowed (use path, method or authority)`},
	{name: "response_json empty path", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_json:"`)), want: `config: rules[0].algorithm_config.cost_source: source "response_json:": path must be 1 to 256 bytes`},
	{name: "response_json empty name", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_json:usage..total"`)), want: `config: rules[0].algorithm_config.cost_source: source "response_json:usage..total": path must be dot-separated names of A-Z a-z 0-9 _ - (no empty name)`},
	{name: "response_json wildcard", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_json:usage.*"`)), want: `config: rules[0].algorithm_config.cost_source: source "response_json:usage.*": path must be dot-separated names of A-Z a-z 0-9 _ - (no wildcards, queries, modifiers or escapes), got "*"`},
	{name: "response_json modifier", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_json:@reverse"`)), want: `config: rules[0].algorithm_config.cost_source: source "response_json:@reverse": path must be dot-separated names of A-Z a-z 0-9 _ - (no wildcards, queries, modifiers or escapes), got "@"`},
	{name: "response_json path too long", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_json:`+strings.Repeat("a", 257)+`"`)), want: `config: rules[0].algorithm_config.cost_source: source "response_json:` + strings.Repeat("a", 257) + `": path must be 1 to 256 bytes`, gap: gapLength},
	{name: "max_body_bytes without response_json", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_header:x-usage","max_body_bytes":10`)), want: `config: rules[0].algorithm_config.max_body_bytes: only with cost_source response_json:<path> (the only cost read from a body)`},
	{name: "truncated_cost without response_json", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_header:x-usage","truncated_cost":10`)), want: `config: rules[0].algorithm_config.truncated_cost: only with cost_source response_json:<path> (the only cost a response can cut short)`},
	{name: "truncated_cost above burst", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_json:u","truncated_cost":11`)), want: `config: rules[0].algorithm_config.truncated_cost: must be <= burst (10), got 11: such a request could never pass`, gap: gapRelation},
	{name: "truncated_cost below MinCost", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_json:u","truncated_cost":0.0001`)), want: `config: rules[0].algorithm_config.truncated_cost: must be at least 0.001 (MinCost), got 0.0001`},
	{name: "truncated_cost zero", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_json:u","truncated_cost":0`)), want: `config: rules[0].algorithm_config.truncated_cost: must be > 0, got 0`},
	{name: "max_body_bytes zero", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_json:u","max_body_bytes":0`)), want: `config: rules[0].algorithm_config.max_body_bytes: must be between 1 and 16777216, got 0`},
	{name: "max_body_bytes too large", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_json:u","max_body_bytes":16777217`)), want: `config: rules[0].algorithm_config.max_body_bytes: must be between 1 and 16777216, got 16777217`},
	{name: "max_body_bytes fraction", in: doc("", alg(`"tokens_per_second":1,"burst":10,"cost_source":"response_json:u","max_body_bytes":1.5`)), want: `config: rules[0].algorithm_config.max_body_bytes: must be an integer, got 1.5`},
	{name: "charge_on not an array", in: doc("", rule(`"charge_on":"2xx"`)), want: `config: rules[0].charge_on: must be an array, got string`},
	{name: "charge_on empty", in: doc("", rule(`"charge_on":[]`)), want: `config: rules[0].charge_on: must hold at least one status (absent: every response is charged)`},
	{name: "charge_on number", in: doc("", rule(`"charge_on":[401]`)), want: `config: rules[0].charge_on[0]: must be a string, got number`},
	{name: "charge_on unknown class", in: doc("", rule(`"charge_on":["2xx","6xx"]`)), want: `config: rules[0].charge_on[1]: must be a status class "1xx" to "5xx" or a status "100" to "599", got "6xx"`},
	{name: "charge_on upper-case class", in: doc("", rule(`"charge_on":["2XX"]`)), want: `config: rules[0].charge_on[0]: must be a status class "1xx" to "5xx" or a status "100" to "599", got "2XX"`},
	{name: "charge_on status out of range", in: doc("", rule(`"charge_on":["099"]`)), want: `config: rules[0].charge_on[0]: must be a status class "1xx" to "5xx" or a status "100" to "599", got "099"`},
	{name: "charge_on repeated", in: doc("", rule(`"charge_on":["401","429","401"]`)), want: `config: rules[0].charge_on[2]: "401" repeats rules[0].charge_on[0]`},
	{name: "charge_on status inside a listed class", in: doc("", rule(`"charge_on":["401","4xx"]`)), want: `config: rules[0].charge_on[0]: "401" is already in "4xx"`, gap: gapClass},
	{name: "charge_on on an allow rule", in: doc("", `{"name":"a","action":"allow","charge_on":["2xx"]}`), want: `config: rules[0].charge_on: not allowed with action "allow" (an allow rule takes only name, action, group and match)`},

	// Cluster rules: what the limit service accepts, one service for all.
	{name: "cluster burst above the service's bound", in: doc(svc, `{"name":"r","scope":"cluster","algorithm":"token_bucket","algorithm_config":{"tokens_per_second":1e6,"burst":1e12}}`), want: `config: rules[0].algorithm_config.burst: must be at most 1000000000 for a cluster rule (the limit service's bound), got 1000000000000`, gap: gapRelation},
	{name: "cluster refill above the service's bound", in: doc(svc, `{"name":"r","scope":"cluster","algorithm":"token_bucket","algorithm_config":{"tokens_per_second":0.001,"burst":31536}}`), want: `config: rules[0].algorithm_config.burst: burst / tokens_per_second is 31536000 seconds to refill, more than the limit service accepts for a cluster rule (604800 seconds)`, gap: gapRelation},
	{name: "cluster rules with two services", in: doc(svc, rule(`"scope":"cluster"`), `{"name":"s","scope":"cluster","service":{"cluster":"d"},`+okAlg+`}`), want: `config: rules[1].service.cluster: every cluster rule must use the same service (one callout per request carries them all): rules[0] has "c", rules[1] has "d"`, gap: gapUnique},
	{name: "shadow cluster rule with another service", in: doc(svc, rule(`"scope":"cluster"`), `{"name":"s","mode":"shadow","scope":"cluster","service":{"cluster":"c","timeout_ms":5},`+okAlg+`}`), want: `config: rules[1].service.timeout_ms: every cluster rule must use the same service (one callout per request carries them all): rules[0] has 25, rules[1] has 5`, gap: gapUnique},
	{name: "cluster rules with two failure modes", in: doc("", `{"name":"r","scope":"cluster","service":{"cluster":"limit_service"},`+okAlg+`}`, `{"name":"s","scope":"cluster","service":{"cluster":"limit_service","failure_mode":"deny"},`+okAlg+`}`), want: `config: rules[1].service.failure_mode: every cluster rule must use the same service (one callout per request carries them all): rules[0] has "allow", rules[1] has "deny"`, gap: gapUnique},
	{name: "cluster rules with two tokens", in: doc("", `{"name":"a","scope":"cluster","service":{"cluster":"c","token":"t1"},`+okAlg+`}`, rule(""), `{"name":"s","scope":"cluster","service":{"cluster":"c","token":"t2"},`+okAlg+`}`), want: `config: rules[2].service.token: every cluster rule must use the same service (one callout per request carries them all): rules[0] and rules[2] have different tokens`, gap: gapUnique},
	{name: "cluster rules with two key secrets", in: doc("", `{"name":"a","scope":"cluster","service":{"cluster":"c","key_secret":"0123456789abcdef"},`+okAlg+`}`, `{"name":"s","scope":"cluster","service":{"cluster":"c","key_secret":"0123456789abcdeX"},`+okAlg+`}`), want: `config: rules[1].service.key_secret: every cluster rule must use the same service (one callout per request carries them all): rules[0] and rules[1] have different key secrets`, gap: gapUnique},
	{name: "17 cluster rules", in: doc(svc, manyRules(17, `"scope":"cluster",`)...), want: `config: rules[16].scope: at most 16 cluster rules (the buckets one limit-service decision takes)`, gap: gapCount},

	// The document.
	{name: "empty input", in: ``, want: `config: invalid JSON: unexpected end of JSON input (at byte 0)`},
	{name: "truncated", in: `{"rules":`, want: `config: invalid JSON: unexpected end of JSON input (at byte 9)`},
	{name: "two documents", in: `{} {}`, want: `config: invalid JSON: invalid character '{' after top-level value (at byte 4)`},
	{name: "trailing comma", in: `{"rules":[],}`, want: `config: invalid JSON: invalid character '}' looking for beginning of object key string (at byte 13)`},
	{name: "invalid UTF-8", in: doc("", rule(`"body":"`+"\xff"+`"`)), want: `config: invalid JSON: not valid UTF-8`, gap: gapUTF8},
	{name: "top level array", in: `[]`, want: `config: the configuration must be a JSON object, got array`},
	{name: "top level string", in: `"rules"`, want: `config: the configuration must be a JSON object, got string`},
	{name: "top level null", in: `null`, want: `config: the configuration must be a JSON object, got null`},
	{name: "unknown top-level field", in: doc(`"rule":[]`, rule("")), want: `config: rule: unknown field`},
	{name: "odd unknown field", in: doc(`"a b":1`, rule("")), want: `config: ["a b"]: unknown field`},
	{name: "duplicate top-level field", in: `{"rules":[` + rule("") + `],"rules":[` + rule("") + `]}`, want: `config: rules: duplicate field`, gap: gapDuplicate},

	// Top-level fields.
	{name: "rules missing", in: `{}`, want: `config: rules: required`},
	{name: "rules not an array", in: `{"rules":{}}`, want: `config: rules: must be an array, got object`},
	{name: "rules null", in: `{"rules":null}`, want: `config: rules: must be an array, got null`},
	{name: "rules empty", in: `{"rules":[]}`, want: `config: rules: must hold at least one rule`},
	{name: "xff too many", in: doc(`"xff_num_trusted_hops":17`, rule("")), want: `config: xff_num_trusted_hops: must be between 0 and 16, got 17`},
	{name: "xff negative", in: doc(`"xff_num_trusted_hops":-1`, rule("")), want: `config: xff_num_trusted_hops: must be between 0 and 16, got -1`},
	{name: "xff fraction", in: doc(`"xff_num_trusted_hops":1.5`, rule("")), want: `config: xff_num_trusted_hops: must be an integer, got 1.5`},
	{name: "xff small fraction", in: doc(`"xff_num_trusted_hops":15e-1`, rule("")), want: `config: xff_num_trusted_hops: must be an integer, got 15e-1`},
	{name: "xff string", in: doc(`"xff_num_trusted_hops":"1"`, rule("")), want: `config: xff_num_trusted_hops: must be an integer, got string`},
	{name: "xff huge", in: doc(`"xff_num_trusted_hops":1e400`, rule("")), want: `config: xff_num_trusted_hops: must be between 0 and 16, got 1e400`},
	{name: "trust_unverified_jwt string", in: doc(`"trust_unverified_jwt":"yes"`, rule("")), want: `config: trust_unverified_jwt: must be a boolean, got string`},
	{name: "jwt namespace empty", in: doc(`"jwt_metadata_namespace":""`, rule("")), want: `config: jwt_metadata_namespace: must not be empty`},
	{name: "jwt payload key number", in: doc(`"jwt_payload_key":5`, rule("")), want: `config: jwt_payload_key: must be a string, got number`},
	{name: "jwt payload key control", in: doc(`"jwt_payload_key":"a\u0001"`, rule("")), want: `config: jwt_payload_key: must not hold control characters`},
	{name: "mode unknown", in: doc(`"mode":"dry-run"`, rule("")), want: `config: mode: must be one of "enforce", "shadow", got "dry-run"`},
	{name: "headers unknown", in: doc(`"headers":"all"`, rule("")), want: `config: headers: must be one of "both", "draft", "legacy", "none", got "all"`},
	{name: "max_keys too small", in: doc(`"max_keys":15`, rule("")), want: `config: max_keys: must be between 16 and 10000000, got 15`},
	{name: "max_keys too large", in: doc(`"max_keys":10000001`, rule("")), want: `config: max_keys: must be between 16 and 10000000, got 10000001`},
	{name: "max_keys fraction", in: doc(`"max_keys":100000.5`, rule("")), want: `config: max_keys: must be an integer, got 100000.5`},
	{name: "scope unknown", in: doc(`"scope":"global"`, rule("")), want: `config: scope: must be one of "local", "cluster", got "global"`},

	// Services.
	{name: "service string", in: doc(`"service":"limitd"`, rule("")), want: `config: service: must be an object, got string`},
	{name: "service without cluster", in: doc(`"service":{"timeout_ms":5}`, rule("")), want: `config: service.cluster: required`},
	{name: "service unknown field", in: doc(`"service":{"cluster":"c","timeout":5}`, rule("")), want: `config: service.timeout: unknown field`},
	{name: "service cluster empty", in: doc(`"service":{"cluster":""}`, rule("")), want: `config: service.cluster: must not be empty`},
	{name: "service cluster space", in: doc(`"service":{"cluster":"a b"}`, rule("")), want: `config: service.cluster: must not contain spaces`},
	{name: "service authority space", in: doc(`"service":{"cluster":"c","authority":"a b"}`, rule("")), want: `config: service.authority: must not contain spaces`},
	{name: "service path relative", in: doc(`"service":{"cluster":"c","path":"v1/decide"}`, rule("")), want: `config: service.path: must start with / and contain no spaces, got "v1/decide"`},
	{name: "service timeout zero", in: doc(`"service":{"cluster":"c","timeout_ms":0}`, rule("")), want: `config: service.timeout_ms: must be between 1 and 60000, got 0`},
	{name: "service timeout large", in: doc(`"service":{"cluster":"c","timeout_ms":60001}`, rule("")), want: `config: service.timeout_ms: must be between 1 and 60000, got 60001`},
	{name: "lease timeout zero", in: doc(`"service":{"cluster":"c","lease_timeout_ms":0}`, rule("")), want: `config: service.lease_timeout_ms: must be between 1 and 60000, got 0`},
	{name: "lease timeout below timeout", in: doc(`"service":{"cluster":"c","timeout_ms":100,"lease_timeout_ms":50}`, rule("")), want: `config: service.lease_timeout_ms: must be >= timeout_ms (100), got 50`, gap: gapRelation},
	{name: "service failure mode", in: doc(`"service":{"cluster":"c","failure_mode":"open"}`, rule("")), want: `config: service.failure_mode: must be one of "allow", "deny", got "open"`},
	{name: "service token_file", in: doc(`"service":{"cluster":"c","token":"t","token_file":"/f"}`, rule("")), want: `config: service.token_file: unknown field`},
	{name: "service token space", in: doc(`"service":{"cluster":"c","token":"a b"}`, rule("")), want: `config: service.token: must not contain spaces`},
	{name: "service key_secret short", in: doc(`"service":{"cluster":"c","key_secret":"short"}`, rule("")), want: `config: service.key_secret: must hold at least 16 bytes, got 5`},

	// Rules.
	{name: "rule not an object", in: `{"rules":[1]}`, want: `config: rules[0]: must be an object, got number`},
	{name: "name missing", in: `{"rules":[{` + okAlg + `}]}`, want: `config: rules[0].name: required`},
	{name: "name empty", in: doc("", `{"name":"",`+okAlg+`}`), want: `config: rules[0].name: must be 1 to 64 of A-Z a-z 0-9 _ . -, got ""`},
	{name: "name space", in: doc("", `{"name":"a b",`+okAlg+`}`), want: `config: rules[0].name: must be 1 to 64 of A-Z a-z 0-9 _ . -, got "a b"`},
	{name: "name too long", in: doc("", `{"name":"`+strings.Repeat("a", 65)+`",`+okAlg+`}`), want: `config: rules[0].name: must be 1 to 64 of A-Z a-z 0-9 _ . -, got "` + strings.Repeat("a", 65) + `"`},
	{name: "name number", in: doc("", `{"name":1,`+okAlg+`}`), want: `config: rules[0].name: must be a string, got number`},
	{name: "name duplicate", in: doc("", rule(""), `{"name":"x",`+okAlg+`}`, rule("")), want: `config: rules[2].name: "r" is already the name of rules[0]`, gap: gapUnique},
	{name: "unknown rule field", in: doc("", rule(`"limit":5`)), want: `config: rules[0].limit: unknown field`},
	{name: "duplicate rule field", in: doc("", `{"name":"a","name":"b",`+okAlg+`}`), want: `config: rules[0].name: duplicate field`, gap: gapDuplicate},
	{name: "action unknown", in: doc("", rule(`"action":"block"`)), want: `config: rules[0].action: must be one of "limit", "allow", got "block"`},
	{name: "allow with algorithm", in: doc("", `{"name":"a","action":"allow","algorithm":"token_bucket"}`), want: `config: rules[0].algorithm: not allowed with action "allow" (an allow rule takes only name, action, group and match)`},
	{name: "allow with mode", in: doc("", `{"name":"a","mode":"shadow","action":"allow"}`), want: `config: rules[0].mode: not allowed with action "allow" (an allow rule takes only name, action, group and match)`},
	{name: "allow with limit_keys", in: doc("", `{"name":"a","action":"allow","limit_keys":["path"]}`), want: `config: rules[0].limit_keys: not allowed with action "allow" (an allow rule takes only name, action, group and match)`},
	{name: "mode unknown on rule", in: doc("", rule(`"mode":"audit"`)), want: `config: rules[0].mode: must be one of "enforce", "shadow", got "audit"`},
	{name: "group empty", in: doc("", rule(`"group":""`)), want: `config: rules[0].group: must be 1 to 64 of A-Z a-z 0-9 _ . -, got ""`},
	{name: "group number", in: doc("", rule(`"group":1`)), want: `config: rules[0].group: must be a string, got number`},
	{name: "missing_key unknown", in: doc("", rule(`"missing_key":"reject"`)), want: `config: rules[0].missing_key: must be one of "skip", "shared", "deny", got "reject"`},
	{name: "status too low", in: doc("", rule(`"status":399`)), want: `config: rules[0].status: must be between 400 and 599, got 399`},
	{name: "status too high", in: doc("", rule(`"status":600`)), want: `config: rules[0].status: must be between 400 and 599, got 600`},
	{name: "status fraction", in: doc("", rule(`"status":429.5`)), want: `config: rules[0].status: must be an integer, got 429.5`},
	{name: "status string", in: doc("", rule(`"status":"429"`)), want: `config: rules[0].status: must be an integer, got string`},
	{name: "body number", in: doc("", rule(`"body":1`)), want: `config: rules[0].body: must be a string, got number`},
	{name: "scope unknown on rule", in: doc("", rule(`"scope":"region"`)), want: `config: rules[0].scope: must be one of "local", "cluster", got "region"`},
	{name: "cluster rule without service", in: doc("", rule(`"scope":"cluster"`)), want: `config: rules[0].service: required with scope "cluster" (on the rule or at the top level)`},
	{name: "cluster default without service", in: doc(`"scope":"cluster"`, rule("")), want: `config: rules[0].service: required with scope "cluster" (on the rule or at the top level)`},
	{name: "service on local rule", in: doc("", rule(`"scope":"local","service":{"cluster":"c"}`)), want: `config: rules[0].service: only allowed with scope "cluster"`},
	{name: "service on inherited local rule", in: doc("", rule(`"service":{"cluster":"c"}`)), want: `config: rules[0].service: only allowed with scope "cluster"`},
	{name: "sync on local rule", in: doc("", rule(`"sync":"lease"`)), want: `config: rules[0].sync: only allowed with scope "cluster"`, gap: "a rule's scope may be inherited from the top level"},
	{name: "sync unknown", in: doc(`"service":{"cluster":"c"}`, rule(`"scope":"cluster","sync":"batch"`)), want: `config: rules[0].sync: must be one of "per_request", "lease", got "batch"`},
	{name: "lease without sync lease", in: doc(`"service":{"cluster":"c"}`, rule(`"scope":"cluster","lease":{"ttl_ms":500}`)), want: `config: rules[0].lease: only allowed with sync "lease"`},
	{name: "lease on shadow rule", in: doc(`"service":{"cluster":"c"}`, rule(`"scope":"cluster","mode":"shadow","sync":"lease"`)), want: `config: rules[0].sync: "lease" is for enforced rules: a shadow rule is sent per request, to measure what it would do`, gap: "a rule's mode may be inherited from the top level"},
	{name: "lease ttl too short", in: doc(`"service":{"cluster":"c"}`, rule(`"scope":"cluster","sync":"lease","lease":{"ttl_ms":50}`)), want: `config: rules[0].lease.ttl_ms: must be between 100 and 60000, got 50`},
	{name: "lease share too big", in: doc(`"service":{"cluster":"c"}`, rule(`"scope":"cluster","sync":"lease","lease":{"max_share":0.75}`)), want: `config: rules[0].lease.max_share: must be at most 0.5, got 0.75`},
	{name: "lease share zero", in: doc(`"service":{"cluster":"c"}`, rule(`"scope":"cluster","sync":"lease","lease":{"max_share":0}`)), want: `config: rules[0].lease.max_share: must be > 0, got 0`},
	{name: "lease unknown field", in: doc(`"service":{"cluster":"c"}`, rule(`"scope":"cluster","sync":"lease","lease":{"size":5}`)), want: `config: rules[0].lease.size: unknown field`},
	{name: "charge_path with a space", in: doc(`"service":{"cluster":"c","charge_path":"/v1/ch arge"}`, rule(`"scope":"cluster"`)), want: `config: service.charge_path: must start with / and contain no spaces, got "/v1/ch arge"`},
	{name: "lease_path relative", in: doc(`"service":{"cluster":"c","lease_path":"v1/lease"}`, rule(`"scope":"cluster"`)), want: `config: service.lease_path: must start with / and contain no spaces, got "v1/lease"`},
	{name: "rule service without cluster", in: doc("", rule(`"scope":"cluster","service":{"path":"/x"}`)), want: `config: rules[0].service.cluster: required`},

	// The algorithm.
	{name: "algorithm missing", in: doc("", `{"name":"r","algorithm_config":{"tokens_per_second":1,"burst":1}}`), want: `config: rules[0].algorithm: required for action "limit"`},
	{name: "algorithm unknown", in: doc("", `{"name":"r","algorithm":"leaky_bucket","algorithm_config":{"tokens_per_second":1,"burst":1}}`), want: `config: rules[0].algorithm: must be "token_bucket", "quota" or "concurrency", got "leaky_bucket"`},
	{name: "algorithm_config missing", in: doc("", `{"name":"r","algorithm":"token_bucket"}`), want: `config: rules[0].algorithm_config: required for action "limit"`},
	{name: "algorithm_config array", in: doc("", `{"name":"r","algorithm":"token_bucket","algorithm_config":[]}`), want: `config: rules[0].algorithm_config: must be an object, got array`},
	{name: "algorithm_config unknown field", in: doc("", alg(`"tokens_per_second":1,"burst":1,"refill":2`)), want: `config: rules[0].algorithm_config.refill: unknown field`},
	{name: "rate missing", in: doc("", alg(`"burst":1`)), want: `config: rules[0].algorithm_config.tokens_per_second: required (or its alias rps)`},
	{name: "rate and alias", in: doc("", alg(`"tokens_per_second":1,"rps":1,"burst":1`)), want: `config: rules[0].algorithm_config.rps: cannot be combined with tokens_per_second (rps is its alias)`},
	{name: "rate zero", in: doc("", alg(`"tokens_per_second":0,"burst":1`)), want: `config: rules[0].algorithm_config.tokens_per_second: must be > 0, got 0`},
	{name: "rate negative", in: doc("", alg(`"rps":-1,"burst":1`)), want: `config: rules[0].algorithm_config.rps: must be > 0, got -1`},
	{name: "rate underflow", in: doc("", alg(`"rps":1e-400,"burst":1`)), want: `config: rules[0].algorithm_config.rps: must be > 0, got 1e-400`, gap: "the schema compares exact decimals: 1e-400 > 0"},
	{name: "rate string", in: doc("", alg(`"tokens_per_second":"10","burst":50`)), want: `config: rules[0].algorithm_config.tokens_per_second: must be a number, got string`},
	{name: "rate too high", in: doc("", alg(`"tokens_per_second":2e9,"burst":1e10`)), want: `config: rules[0].algorithm_config.tokens_per_second: must be at most 1000000000, got 2e9`},
	{name: "rate huge", in: doc("", alg(`"tokens_per_second":1e999,"burst":1`)), want: `config: rules[0].algorithm_config.tokens_per_second: must be at most 1000000000, got 1e999`},
	{name: "rate huge negative", in: doc("", alg(`"tokens_per_second":-1e999,"burst":1`)), want: `config: rules[0].algorithm_config.tokens_per_second: must be > 0, got -1e999`},
	{name: "burst missing", in: doc("", alg(`"tokens_per_second":1`)), want: `config: rules[0].algorithm_config.burst: required`},
	{name: "burst null", in: doc("", alg(`"tokens_per_second":1,"burst":null`)), want: `config: rules[0].algorithm_config.burst: must be a number, got null`},
	{name: "burst below rate", in: doc("", alg(`"tokens_per_second":10,"burst":5`)), want: `config: rules[0].algorithm_config.burst: must be >= tokens_per_second (10), got 5`, gap: gapRelation},
	{name: "burst below rate, second rule", in: doc("", `{"name":"a",`+okAlg+`}`, `{"name":"b","algorithm":"token_bucket","algorithm_config":{"tokens_per_second":10,"burst":5}}`), want: `config: rules[1].algorithm_config.burst: must be >= tokens_per_second (10), got 5`, gap: gapRelation},
	{name: "burst below rps", in: doc("", alg(`"rps":2.5,"burst":2`)), want: `config: rules[0].algorithm_config.burst: must be >= rps (2.5), got 2`, gap: gapRelation},
	{name: "max_delay_ms negative", in: doc("", alg(`"tokens_per_second":10,"burst":10,"max_delay_ms":-1`)), want: `config: rules[0].algorithm_config.max_delay_ms: must be between 0 and 60000, got -1`},
	{name: "max_delay_ms above a minute", in: doc("", alg(`"tokens_per_second":10,"burst":10,"max_delay_ms":60001`)), want: `config: rules[0].algorithm_config.max_delay_ms: must be between 0 and 60000, got 60001`},
	{name: "max_delay_ms fraction", in: doc("", alg(`"tokens_per_second":10,"burst":10,"max_delay_ms":1.5`)), want: `config: rules[0].algorithm_config.max_delay_ms: must be an integer, got 1.5`},
	{name: "max_delay_ms string", in: doc("", alg(`"tokens_per_second":10,"burst":10,"max_delay_ms":"1s"`)), want: `config: rules[0].algorithm_config.max_delay_ms: must be an integer, got string`},
	{name: "max_waiting without a delay", in: doc("", alg(`"tokens_per_second":10,"burst":10,"max_waiting":5`)), want: `config: rules[0].algorithm_config.max_waiting: only with max_delay_ms > 0 (a rule that never holds a request has nothing waiting)`, gap: gapRelation},
	{name: "max_waiting zero", in: doc("", alg(`"tokens_per_second":10,"burst":1,"max_delay_ms":1000,"max_waiting":0`)), want: `config: rules[0].algorithm_config.max_waiting: must be between 1 and 100000, got 0`},
	{name: "max_waiting too many", in: doc("", alg(`"tokens_per_second":10,"burst":1,"max_delay_ms":1000,"max_waiting":100001`)), want: `config: rules[0].algorithm_config.max_waiting: must be between 1 and 100000, got 100001`},
	{name: "burst below rate, delay 0", in: doc("", alg(`"tokens_per_second":10,"burst":1,"max_delay_ms":0`)), want: `config: rules[0].algorithm_config.burst: must be >= tokens_per_second (10), got 1`, gap: gapRelation},
	{name: "burst below rate, leased, delay 0", in: doc(`"service":{"cluster":"c"}`, `{"name":"r","scope":"cluster","sync":"lease","algorithm":"token_bucket","algorithm_config":{"tokens_per_second":10,"burst":1,"max_delay_ms":0}}`), want: `config: rules[0].algorithm_config.burst: must be >= tokens_per_second (10), got 1`, gap: gapRelation},
	{name: "burst too high", in: doc("", alg(`"tokens_per_second":1e9,"burst":1e13`)), want: `config: rules[0].algorithm_config.burst: must be at most 1000000000000, got 1e13`},
	{name: "refill longer than a year", in: doc("", alg(`"tokens_per_second":0.000001,"burst":100`)), want: `config: rules[0].algorithm_config.burst: burst / tokens_per_second is 100000000 seconds to refill, more than one year (31536000)`, gap: gapRelation},
	{name: "cost_source jwt", in: doc("", alg(`"tokens_per_second":1,"burst":1,"cost_source":"jwt:cost"`)), want: `config: rules[0].algorithm_config.cost_source: must be "fixed", header:<name>, query:<name>, response_header:<name> or response_json:<path>, got "jwt:cost"`},
	{name: "cost_source unknown", in: doc("", alg(`"tokens_per_second":1,"burst":1,"cost_source":"constant"`)), want: `config: rules[0].algorithm_config.cost_source: must be "fixed", header:<name>, query:<name>, response_header:<name> or response_json:<path>, got "constant"`},
	{name: "cost_source empty header", in: doc("", alg(`"tokens_per_second":1,"burst":1,"cost_source":"header:"`)), want: "config: rules[0].algorithm_config.cost_source: source \"header:\": header name must be a non-empty HTTP token (letters, digits and !#$%&'*+-.^_`|~)"},
	{name: "cost_source number", in: doc("", alg(`"tokens_per_second":1,"burst":1,"cost_source":1`)), want: `config: rules[0].algorithm_config.cost_source: must be a string, got number`},
	{name: "fixed_cost zero", in: doc("", alg(`"tokens_per_second":1,"burst":1,"fixed_cost":0`)), want: `config: rules[0].algorithm_config.fixed_cost: must be > 0, got 0`},
	{name: "fixed_cost above burst", in: doc("", alg(`"tokens_per_second":10,"burst":50,"fixed_cost":60`)), want: `config: rules[0].algorithm_config.fixed_cost: must be <= burst (50), got 60: such a request could never pass`, gap: gapRelation},
	{name: "default_cost negative", in: doc("", alg(`"tokens_per_second":1,"burst":1,"default_cost":-1`)), want: `config: rules[0].algorithm_config.default_cost: must be > 0, got -1`},
	{name: "default_cost string", in: doc("", alg(`"tokens_per_second":1,"burst":1,"default_cost":"1"`)), want: `config: rules[0].algorithm_config.default_cost: must be a number, got string`},
	{name: "default_cost above burst", in: doc("", alg(`"tokens_per_second":1,"burst":2,"cost_source":"header:x-cost","default_cost":2.5`)), want: `config: rules[0].algorithm_config.default_cost: must be <= burst (2), got 2.5: such a request could never pass`, gap: gapRelation},

	// Response headers.
	{name: "response_headers array", in: doc("", rule(`"response_headers":[]`)), want: `config: rules[0].response_headers: must be an object, got array`},
	{name: "response header bad name", in: doc("", rule(`"response_headers":{"x y":"1"}`)), want: "config: rules[0].response_headers[\"x y\"]: header name must be a non-empty HTTP token (letters, digits and !#$%&'*+-.^_`|~)"},
	{name: "response header empty name", in: doc("", rule(`"response_headers":{"":"1"}`)), want: "config: rules[0].response_headers[\"\"]: header name must be a non-empty HTTP token (letters, digits and !#$%&'*+-.^_`|~)"},
	{name: "response header pseudo", in: doc("", rule(`"response_headers":{":status":"200"}`)), want: `config: rules[0].response_headers[":status"]: pseudo-headers are not allowed (use path, method or authority)`},
	{name: "response header content-length", in: doc("", rule(`"response_headers":{"Content-Length":"0"}`)), want: `config: rules[0].response_headers["Content-Length"]: content-length cannot be set by a rule`},
	{name: "response header connection", in: doc("", rule(`"response_headers":{"connection":"close"}`)), want: `config: rules[0].response_headers.connection: connection cannot be set by a rule`},
	{name: "response header twice", in: doc("", rule(`"response_headers":{"X-A":"1","x-a":"2"}`)), want: `config: rules[0].response_headers["x-a"]: header x-a is already set`, gap: gapCase},
	{name: "response header exact twice", in: doc("", rule(`"response_headers":{"x-a":"1","x-a":"2"}`)), want: `config: rules[0].response_headers["x-a"]: duplicate field`, gap: gapDuplicate},
	{name: "response header value newline", in: doc("", rule(`"response_headers":{"x-a":"1\r\nx-b: 2"}`)), want: `config: rules[0].response_headers["x-a"]: value must not hold control characters`},
	{name: "response header value number", in: doc("", rule(`"response_headers":{"x-a":1}`)), want: `config: rules[0].response_headers["x-a"]: must be a string, got number`},

	// Limit keys.
	{name: "limit_keys string", in: doc("", rule(`"limit_keys":"header:x"`)), want: `config: rules[0].limit_keys: must be an array, got string`},
	{name: "limit key number", in: doc("", rule(`"limit_keys":[1]`)), want: `config: rules[0].limit_keys[0]: must be a string, got number`},
	{name: "limit key empty", in: doc("", rule(`"limit_keys":[""]`)), want: `config: rules[0].limit_keys[0]: empty source`},
	{name: "limit key unknown", in: doc("", rule(`"limit_keys":["path","user"]`)), want: `config: rules[0].limit_keys[1]: unknown source "user" (want header:<name>, query:<name>, ip:address, path, method, authority, jwt:<claim>, cookie:<name> or request_json:<path>)`},
	{name: "limit key fixed", in: doc("", rule(`"limit_keys":["fixed"]`)), want: `config: rules[0].limit_keys[0]: unknown source "fixed" (want header:<name>, query:<name>, ip:address, path, method, authority, jwt:<claim>, cookie:<name> or request_json:<path>)`},
	{name: "limit key header without name", in: doc("", rule(`"limit_keys":["header:"]`)), want: "config: rules[0].limit_keys[0]: source \"header:\": header name must be a non-empty HTTP token (letters, digits and !#$%&'*+-.^_`|~)"},
	{name: "limit key pseudo header", in: doc("", rule(`"limit_keys":["header::path"]`)), want: `config: rules[0].limit_keys[0]: source "header::path": pseudo-headers are not allowed (use path, method or authority)`},
	{name: "limit key ip port", in: doc("", rule(`"limit_keys":["ip:port"]`)), want: `config: rules[0].limit_keys[0]: source "ip:port": the only ip source is ip:address`},
	{name: "limit key ip bare", in: doc("", rule(`"limit_keys":["ip"]`)), want: `config: rules[0].limit_keys[0]: source "ip": the only ip source is ip:address`},
	{name: "limit key path with name", in: doc("", rule(`"limit_keys":["path:/x"]`)), want: `config: rules[0].limit_keys[0]: source "path:/x": path takes no name`},
	{name: "limit key jwt empty segment", in: doc("", rule(`"limit_keys":["jwt:org..id"]`)), want: `config: rules[0].limit_keys[0]: source "jwt:org..id": claim must be non-empty dot-separated names, without control characters`},
	{name: "limit key cookie space", in: doc("", rule(`"limit_keys":["cookie:a b"]`)), want: `config: rules[0].limit_keys[0]: source "cookie:a b": cookie name must be a non-empty HTTP token`},
	{name: "limit key query empty", in: doc("", rule(`"limit_keys":["query:"]`)), want: `config: rules[0].limit_keys[0]: source "query:": query parameter name must be non-empty, without control characters`},
	{name: "limit key twice", in: doc("", rule(`"limit_keys":["header:x","path","header:x"]`)), want: `config: rules[0].limit_keys[2]: "header:x" repeats rules[0].limit_keys[0]`},
	{name: "limit key twice in another case", in: doc("", rule(`"limit_keys":["header:X-Key","header:x-key"]`)), want: `config: rules[0].limit_keys[1]: "header:x-key" repeats rules[0].limit_keys[0]`, gap: gapCase},

	// Match.
	{name: "match array", in: doc("", rule(`"match":[]`)), want: `config: rules[0].match: must be an object, got array`},
	{name: "match bad source", in: doc("", rule(`"match":{"url":{"prefix":"/"}}`)), want: `config: rules[0].match.url: unknown source "url" (want header:<name>, query:<name>, ip:address, path, method, authority, jwt:<claim>, cookie:<name> or request_json:<path>)`},
	{name: "match condition string", in: doc("", rule(`"match":{"path":"/x"}`)), want: `config: rules[0].match.path: must be an object, got string`},
	{name: "match condition empty", in: doc("", rule(`"match":{"path":{}}`)), want: `config: rules[0].match.path: needs at least one of present, equals, in, prefix, regex`},
	{name: "match unknown operator", in: doc("", rule(`"match":{"path":{"prefix":"/","suffix":"x"}}`)), want: `config: rules[0].match.path.suffix: unknown operator (want present, equals, in, prefix or regex)`},
	{name: "match present string", in: doc("", rule(`"match":{"header:x-debug":{"present":"no"}}`)), want: `config: rules[0].match["header:x-debug"].present: must be a boolean, got string`},
	{name: "match equals number", in: doc("", rule(`"match":{"header:x-plan":{"equals":1}}`)), want: `config: rules[0].match["header:x-plan"].equals: must be a string, got number`},
	{name: "match in empty", in: doc("", rule(`"match":{"method":{"in":[]}}`)), want: `config: rules[0].match.method.in: must hold at least one value`},
	{name: "match in string", in: doc("", rule(`"match":{"method":{"in":"GET"}}`)), want: `config: rules[0].match.method.in: must be an array, got string`},
	{name: "match in number", in: doc("", rule(`"match":{"method":{"in":["GET",1]}}`)), want: `config: rules[0].match.method.in[1]: must be a string, got number`},
	{name: "match prefix null", in: doc("", rule(`"match":{"path":{"prefix":null}}`)), want: `config: rules[0].match.path.prefix: must be a string, got null`},
	{name: "match regex invalid", in: doc("", rule(`"match":{"path":{"regex":"^/(a"}}`)), want: "config: rules[0].match.path.regex: error parsing regexp: missing closing ): `^/(a`", gap: gapRegex},
	{name: "match regex number", in: doc("", rule(`"match":{"path":{"regex":5}}`)), want: `config: rules[0].match.path.regex: must be a string, got number`},
	{name: "match present false and equals", in: doc("", rule(`"match":{"header:x":{"present":false,"equals":"1"}}`)), want: `config: rules[0].match["header:x"].present: false cannot be combined with equals, in, prefix or regex`},
	{name: "match source twice", in: doc("", rule(`"match":{"header:X":{"present":true},"header:x":{"equals":"1"}}`)), want: `config: rules[0].match["header:x"]: a second condition on "header:x"`, gap: gapCase},
	{name: "match source exact twice", in: doc("", rule(`"match":{"path":{"prefix":"/a"},"path":{"prefix":"/b"}}`)), want: `config: rules[0].match.path: duplicate field`, gap: gapDuplicate},
	{name: "match operator twice", in: doc("", rule(`"match":{"path":{"prefix":"/a","prefix":"/b"}}`)), want: `config: rules[0].match.path.prefix: duplicate field`, gap: gapDuplicate},
	{name: "match on allow rule", in: doc("", `{"name":"a","action":"allow","match":{"ip:address":{"in":[]}}}`), want: `config: rules[0].match["ip:address"].in: must hold at least one value`},
}

func TestParseErrors(t *testing.T) {
	names := make(map[string]bool)
	for _, tc := range badCases {
		if names[tc.name] {
			t.Errorf("two cases named %q", tc.name)
		}
		names[tc.name] = true
		c, err := Parse([]byte(tc.in))
		if err == nil {
			t.Errorf("%s: Parse(%s) succeeded, want error %q", tc.name, tc.in, tc.want)
			continue
		}
		if c != nil {
			t.Errorf("%s: Parse returned a Config with its error", tc.name)
		}
		if err.Error() != tc.want {
			t.Errorf("%s: Parse(%s)\n got error %s\nwant error %s", tc.name, tc.in, err, tc.want)
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: error %T is not an *Error", tc.name, err)
		}
	}
}

func TestErrorPath(t *testing.T) {
	_, err := Parse([]byte(doc("", rule(`"match":{"path":{"regex":"("}}`))))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not an *Error", err)
	}
	if e.Path != "rules[0].match.path.regex" {
		t.Errorf("Path = %q", e.Path)
	}
	if e.Unwrap() == nil {
		t.Errorf("Unwrap() = nil")
	}
}

func ptr[T any](v T) *T { return &v }

// wantRule is what Parse makes of a minimal local limit rule named name.
func wantRule(name string) Rule {
	return Rule{
		Name:   name,
		Limit:  Limit{TokensPerSecond: 10, Burst: 50},
		Cost:   Cost{Source: Source{Kind: SourceFixed}, Fixed: 1, Default: 1},
		Status: 429,
	}
}

func wantConfig(rules ...Rule) *Config {
	return &Config{
		Rules:                rules,
		JWTMetadataNamespace: "envoy.filters.http.jwt_authn",
		JWTPayloadKey:        "jwt_payload",
		MaxKeys:              100000,
	}
}

type goodCase struct {
	name string
	in   string
	want *Config                   // compared after normalising regexes
	also func(*testing.T, *Config) // further checks (pointer identity, regexes)
}

var goodCases = []goodCase{
	{
		name: "cost from a response header, charged on 2xx and 401",
		in: doc("", `{"name":"r","charge_on":["2xx","401"],"algorithm":"token_bucket",
			"algorithm_config":{"tokens_per_second":10,"burst":50,"cost_source":"response_header:X-Usage","default_cost":5}}`),
		want: wantConfig(func() Rule {
			r := wantRule("r")
			r.Cost = Cost{Source: Source{Kind: SourceResponseHeader, Name: "x-usage"}, Fixed: 1, Default: 5}
			r.ChargeOn = StatusSet{Listed: true, Classes: 1 << 2, Codes: []int{401}}
			return r
		}()),
		also: func(t *testing.T, c *Config) {
			cs := c.Rules[0].ChargeOn
			for status, want := range map[int]bool{200: true, 204: true, 299: true, 401: true, 400: false, 429: false, 500: false, 199: false, 0: false} {
				if cs.Has(status) != want {
					t.Errorf("Has(%d) = %v, want %v", status, !want, want)
				}
			}
			if !(StatusSet{}).Has(503) {
				t.Error("the zero StatusSet does not hold 503")
			}
		},
	},
	{
		name: "cost from a JSON body, default max_body_bytes",
		in:   doc("", alg(`"tokens_per_second":10,"burst":50,"cost_source":"response_json:usage.total_tokens"`)),
		want: wantConfig(func() Rule {
			r := wantRule("r")
			r.Cost = Cost{Source: Source{Kind: SourceResponseJSON, Name: "usage.total_tokens"}, Fixed: 1, Default: 1, Truncated: 50, MaxBodyBytes: 1 << 20}
			return r
		}()),
	},
	{
		name: "cost from a JSON body, truncated_cost given",
		in:   doc("", alg(`"tokens_per_second":10,"burst":50,"cost_source":"response_json:n","default_cost":2,"truncated_cost":20`)),
		want: wantConfig(func() Rule {
			r := wantRule("r")
			r.Cost = Cost{Source: Source{Kind: SourceResponseJSON, Name: "n"}, Fixed: 1, Default: 2, Truncated: 20, MaxBodyBytes: 1 << 20}
			return r
		}()),
	},
	{
		name: "cost from a JSON body, every class, shadow and cluster",
		in: doc(svc, `{"name":"r","mode":"shadow","scope":"cluster","charge_on":["1xx","2xx","3xx","4xx","5xx"],"algorithm":"token_bucket",
			"algorithm_config":{"tokens_per_second":10,"burst":50,"cost_source":"response_json:choices.0.usage-x.n_1","max_body_bytes":1}}`),
		also: func(t *testing.T, c *Config) {
			r := c.Rules[0]
			if r.Cost.MaxBodyBytes != 1 || r.Cost.Source.Name != "choices.0.usage-x.n_1" || r.ChargeOn.Classes != 0b111110 || !r.Cost.FromResponse() {
				t.Errorf("rule = %+v", r)
			}
		},
	},
	{
		name: "issue example",
		in: `{"rules": [{"name": "per-key",
			"limit_keys": ["header:x-api-key"],
			"algorithm": "token_bucket",
			"algorithm_config": {"tokens_per_second": 10, "burst": 50,
				"cost_source": "fixed", "fixed_cost": 1, "default_cost": 1}}]}`,
		want: wantConfig(func() Rule {
			r := wantRule("per-key")
			r.LimitKeys = []Source{{Kind: SourceHeader, Name: "x-api-key"}}
			return r
		}()),
	},
	{
		name: "minimal rule gets every default",
		in:   doc("", `{"name":"global",`+okAlg+`}`),
		want: wantConfig(wantRule("global")),
	},
	{
		name: "rps alias, integral numbers in other spellings, empty collections",
		in: doc(`"max_keys":1e5,"xff_num_trusted_hops":2.0`,
			`{"name":"r","limit_keys":[],"match":{},"response_headers":{},"status":4.29e2,"algorithm":"token_bucket","algorithm_config":{"rps":0.5,"burst":2.5}}`),
		want: func() *Config {
			r := wantRule("r")
			r.Limit = Limit{TokensPerSecond: 0.5, Burst: 2.5}
			c := wantConfig(r)
			c.XFFNumTrustedHops = 2
			return c
		}(),
	},
	{
		name: "every top-level field",
		in: `{"xff_num_trusted_hops":16,"trust_unverified_jwt":true,"jwt_metadata_namespace":"ns","jwt_payload_key":"claims",
			"mode":"shadow","headers":"none","max_keys":16,"scope":"cluster",
			"service":{"cluster":"limitd","authority":"limitd.internal","path":"/decide","timeout_ms":60000,"failure_mode":"deny","token":"s3cret"},
			"rules":[` + rule("") + `]}`,
		want: func() *Config {
			s := &Service{Cluster: "limitd", Authority: "limitd.internal", Path: "/decide", LeasePath: "/v1/lease", ChargePath: "/v1/charge", TimeoutMS: 60000, LeaseTimeoutMS: 60000, FailureMode: FailDeny, Token: "s3cret"}
			r := wantRule("r")
			r.Mode, r.Scope, r.Service = ModeShadow, ScopeCluster, s
			return &Config{Rules: []Rule{r}, XFFNumTrustedHops: 16, TrustUnverifiedJWT: true, JWTMetadataNamespace: "ns",
				JWTPayloadKey: "claims", Headers: HeadersNone, MaxKeys: 16, Service: s}
		}(),
		also: func(t *testing.T, c *Config) {
			if c.Rules[0].Service != c.Service {
				t.Errorf("rule service is not the top-level one")
			}
		},
	},
	{
		name: "every rule field",
		in: doc(`"headers":"draft"`, `{"name":"Tier.enterprise_1-a","action":"limit","mode":"enforce","group":"plans",
			"limit_keys":["header:X-Api-Key","query:user","ip:address","path","method","authority","jwt:org.id","cookie:session"],
			"match":{"path":{"prefix":"/api/"},"method":{"in":["POST","PUT"]},"header:X-Plan":{"equals":"enterprise","present":true},
				"jwt:plan":{"regex":"^(gold|silver)$"},"header:x-debug":{"present":false}},
			"missing_key":"shared","algorithm":"token_bucket",
			"algorithm_config":{"tokens_per_second":1000,"burst":2000,"cost_source":"header:X-Cost","fixed_cost":3,"default_cost":0.25},
			"status":503,"body":"{\"error\":\"slow down\"}\n","response_headers":{"X-Reason":"plan\tlimit","cache-control":"no-store"},
			"scope":"cluster","service":{"cluster":"limitd","token":"s3cr3t"}}`),
		want: func() *Config {
			c := wantConfig(Rule{
				Name:  "Tier.enterprise_1-a",
				Group: "plans",
				LimitKeys: []Source{{SourceHeader, "x-api-key"}, {SourceQuery, "user"}, {SourceIP, "address"}, {Kind: SourcePath},
					{Kind: SourceMethod}, {Kind: SourceAuthority}, {SourceJWT, "org.id"}, {SourceCookie, "session"}},
				Match: []Condition{
					{Source: Source{Kind: SourcePath}, Prefix: ptr("/api/")},
					{Source: Source{Kind: SourceMethod}, In: []string{"POST", "PUT"}},
					{Source: Source{SourceHeader, "x-plan"}, Equals: ptr("enterprise"), Present: ptr(true)},
					{Source: Source{SourceJWT, "plan"}, Regex: regexp.MustCompile("^(gold|silver)$"), RegexMaxInput: 963},
					{Source: Source{SourceHeader, "x-debug"}, Present: ptr(false)},
				},
				MissingKey:      MissingShared,
				Limit:           Limit{TokensPerSecond: 1000, Burst: 2000},
				Cost:            Cost{Source: Source{SourceHeader, "x-cost"}, Fixed: 3, Default: 0.25},
				Status:          503,
				Body:            "{\"error\":\"slow down\"}\n",
				ResponseHeaders: []HeaderPair{{"x-reason", "plan\tlimit"}, {"cache-control", "no-store"}},
				Scope:           ScopeCluster,
				Service:         &Service{Cluster: "limitd", Authority: "limitd", Path: "/v1/decide", LeasePath: "/v1/lease", ChargePath: "/v1/charge", TimeoutMS: 25, LeaseTimeoutMS: DefaultLeaseTimeoutMS, Token: "s3cr3t"},
			})
			c.Headers = HeadersDraft
			return c
		}(),
		also: func(t *testing.T, c *Config) {
			re := c.Rules[0].Match[3].Regex
			if re == nil || re.String() != "^(gold|silver)$" || !re.MatchString("gold") || re.MatchString("bronze") {
				t.Errorf("regex = %v", re)
			}
		},
	},
	{
		name: "stacked per-key and global",
		in: doc("",
			`{"name":"per-key","limit_keys":["header:x-api-key"],"algorithm":"token_bucket","algorithm_config":{"tokens_per_second":10,"burst":20}}`,
			`{"name":"global","algorithm":"token_bucket","algorithm_config":{"tokens_per_second":1000,"burst":1000}}`),
		also: func(t *testing.T, c *Config) {
			if len(c.Rules) != 2 || c.Rules[1].LimitKeys != nil || c.Rules[1].Limit.Burst != 1000 {
				t.Errorf("rules = %+v", c.Rules)
			}
		},
	},
	{
		name: "tiers, an allow-list and shadow",
		in: doc(`"mode":"shadow","scope":"cluster","service":{"cluster":"limitd"}`,
			`{"name":"internal","action":"allow","match":{"ip:address":{"prefix":"10."}}}`,
			`{"name":"vip","action":"allow","group":"plan","match":{"header:x-plan":{"equals":"vip"}}}`,
			`{"name":"enterprise","group":"plan","mode":"enforce","scope":"local","match":{"header:x-plan":{"equals":"enterprise"}},"limit_keys":["header:x-api-key"],`+okAlg+`}`,
			`{"name":"free","group":"plan","limit_keys":["header:x-api-key"],`+okAlg+`}`),
		also: func(t *testing.T, c *Config) {
			want := []struct {
				action  Action
				mode    Mode
				scope   Scope
				group   string
				service bool
			}{{ActionAllow, ModeEnforce, ScopeLocal, "", false}, {ActionAllow, ModeEnforce, ScopeLocal, "plan", false},
				{ActionLimit, ModeEnforce, ScopeLocal, "plan", false}, {ActionLimit, ModeShadow, ScopeCluster, "plan", true}}
			for i, w := range want {
				r := c.Rules[i]
				if r.Action != w.action || r.Mode != w.mode || r.Scope != w.scope || r.Group != w.group || (r.Service != nil) != w.service {
					t.Errorf("rules[%d] = %+v, want %+v", i, r, w)
				}
			}
			if c.Rules[0].Status != 0 || c.Rules[0].Limit != (Limit{}) {
				t.Errorf("allow rule has limit fields: %+v", c.Rules[0])
			}
		},
	},
	{
		name: "cluster scope: sync lease with defaults and with tuning",
		in: doc(`"service":{"cluster":"limitd","lease_path":"/rl/lease"}`,
			`{"name":"fleet","scope":"cluster","sync":"lease",`+okAlg+`}`,
			`{"name":"tuned","scope":"cluster","sync":"lease","lease":{"ttl_ms":500,"max_share":0.1},`+okAlg+`}`,
			`{"name":"exact","scope":"cluster","sync":"per_request",`+okAlg+`}`),
		also: func(t *testing.T, c *Config) {
			r := c.Rules
			if r[0].Sync != SyncLease || r[0].Lease != (Lease{TTLMS: DefaultLeaseTTLMS, MaxShare: DefaultLeaseShare}) ||
				r[1].Lease != (Lease{TTLMS: 500, MaxShare: 0.1}) || r[2].Sync != SyncPerRequest ||
				c.Service.LeasePath != "/rl/lease" {
				t.Errorf("config = %+v", c)
			}
		},
	},
	{
		name: "cluster scope: own service, inherited scope, allow rule untouched",
		in: doc(`"scope":"cluster"`,
			`{"name":"open","action":"allow","match":{"path":{"equals":"/healthz"}}}`,
			`{"name":"fleet","service":{"cluster":"limitd","timeout_ms":50},`+okAlg+`}`,
			`{"name":"here","scope":"local",`+okAlg+`}`),
		also: func(t *testing.T, c *Config) {
			if c.Service != nil || c.Rules[0].Scope != ScopeLocal || c.Rules[1].Scope != ScopeCluster ||
				c.Rules[1].Service == nil || c.Rules[1].Service.TimeoutMS != 50 || c.Rules[2].Scope != ScopeLocal {
				t.Errorf("config = %+v", c)
			}
		},
	},
	{
		name: "strings with escapes and non-ASCII",
		in:   doc("", rule(`"body":"\u00e9t\u00E9 \ud83d\ude00 \"q\" \\ \/ \b\f\n\r\t \u0000","match":{"header:x-name":{"equals":"Zoë"}}`)),
		also: func(t *testing.T, c *Config) {
			if got, want := c.Rules[0].Body, "été 😀 \"q\" \\ / \b\f\n\r\t \x00"; got != want {
				t.Errorf("body = %q, want %q", got, want)
			}
			if got := *c.Rules[0].Match[0].Equals; got != "Zoë" {
				t.Errorf("equals = %q", got)
			}
		},
	},
	{
		name: "largest bounds",
		in: doc(`"max_keys":10000000`, alg(`"tokens_per_second":1000000000,"burst":1000000000000,"fixed_cost":1e12,"default_cost":1e12`),
			`{"name":"slow","algorithm":"token_bucket","algorithm_config":{"tokens_per_second":1e-6,"burst":31.5,"fixed_cost":0.001}}`),
		also: func(t *testing.T, c *Config) {
			if c.Rules[0].Limit.Burst != 1e12 || c.Rules[1].Limit.TokensPerSecond != 1e-6 {
				t.Errorf("rules = %+v", c.Rules)
			}
		},
	},
}

func TestParse(t *testing.T) {
	for _, tc := range goodCases {
		c, err := Parse([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: Parse: %v", tc.name, err)
			continue
		}
		checkValid(t, c)
		if tc.want != nil {
			if got, want := normalise(c), normalise(tc.want); !reflect.DeepEqual(got, want) {
				t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, want)
			}
		}
		if tc.also != nil {
			tc.also(t, c)
		}
		roundTrip(t, c)
	}
}

func TestMarshalJSON(t *testing.T) {
	c, err := Parse([]byte(doc(`"service":{"cluster":"limitd"}`,
		`{"name":"a","match":{"header:X-Plan":{"regex":"^p"}},"algorithm":"token_bucket","algorithm_config":{"rps":1,"burst":2,"cost_source":"query:cost"},"scope":"cluster"}`,
		`{"name":"b","action":"allow","group":"g"}`)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"rules":[{"name":"a","action":"limit","mode":"enforce","match":{"header:x-plan":{"regex":"^p"}},"limit_keys":[],` +
		`"missing_key":"skip","algorithm":"token_bucket","algorithm_config":{"tokens_per_second":1,"burst":2,"cost_source":"query:cost",` +
		`"fixed_cost":1,"default_cost":1},"status":429,"body":"","scope":"cluster"},{"name":"b","action":"allow","group":"g"}],` +
		`"xff_num_trusted_hops":0,"trust_unverified_jwt":false,"jwt_metadata_namespace":"envoy.filters.http.jwt_authn",` +
		`"jwt_payload_key":"jwt_payload","headers":"both","max_keys":100000,"service":{"cluster":"limitd","authority":"limitd",` +
		`"path":"/v1/decide","lease_path":"/v1/lease","charge_path":"/v1/charge","timeout_ms":25,"lease_timeout_ms":500,"failure_mode":"allow"}}`
	if string(got) != want {
		t.Errorf("MarshalJSON:\n got %s\nwant %s", got, want)
	}
}

func TestAppendString(t *testing.T) {
	for _, s := range []string{"", "plain", "\"\\/", "\x00\x01\x1f\x7f", "\n\r\t\b\f", "é😀", "\u2028<>&", "bad\xffutf8"} {
		b := appendString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Errorf("appendString(%q) = %s: %v", s, b, err)
			continue
		}
		if want := strings.ToValidUTF8(s, "\uFFFD"); back != want {
			t.Errorf("appendString(%q) = %s, decodes to %q", s, b, back)
		}
	}
}

func TestParseSource(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Source
		err  string
	}{
		{in: "header:X-Api-Key", want: Source{SourceHeader, "x-api-key"}},
		{in: "query:User_ID", want: Source{SourceQuery, "User_ID"}},
		{in: "ip:address", want: Source{SourceIP, "address"}},
		{in: "path", want: Source{Kind: SourcePath}},
		{in: "method", want: Source{Kind: SourceMethod}},
		{in: "authority", want: Source{Kind: SourceAuthority}},
		{in: "jwt:org.id", want: Source{SourceJWT, "org.id"}},
		{in: "jwt:https://example.com/roles", want: Source{SourceJWT, "https://example.com/roles"}},
		{in: "cookie:Session", want: Source{SourceCookie, "Session"}},
		{in: "request_json:model", want: Source{SourceRequestJSON, "model"}},
		{in: "request_json:messages.0.role", want: Source{SourceRequestJSON, "messages.0.role"}},
		{in: "request_json:a..b", err: `source "request_json:a..b": path must be dot-separated names of A-Z a-z 0-9 _ - (no empty name)`},
		{in: "", err: "empty source"},
		{in: "fixed", err: `unknown source "fixed" (want header:<name>, query:<name>, ip:address, path, method, authority, jwt:<claim>, cookie:<name> or request_json:<path>)`},
		{in: "Header:x", err: `unknown source "Header:x" (want header:<name>, query:<name>, ip:address, path, method, authority, jwt:<claim>, cookie:<name> or request_json:<path>)`},
		{in: "method:", err: `source "method:": method takes no name`},
		{in: "jwt:.a", err: `source "jwt:.a": claim must be non-empty dot-separated names, without control characters`},
		{in: "jwt:a.", err: `source "jwt:a.": claim must be non-empty dot-separated names, without control characters`},
		{in: "query:a\nb", err: `source "query:a\nb": query parameter name must be non-empty, without control characters`},
	} {
		got, err := parseSource(tc.in)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("parseSource(%q) = %v, %v; want error %s", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseSource(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		if back, err := parseSource(got.String()); err != nil || back != got {
			t.Errorf("parseSource(%q.String()) = %v, %v", got, back, err)
		}
	}
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{ActionAllow.String(), "allow"}, {ModeShadow.String(), "shadow"}, {MissingDeny.String(), "deny"},
		{ScopeCluster.String(), "cluster"}, {FailDeny.String(), "deny"}, {HeadersLegacy.String(), "legacy"},
		{Mode(7).String(), "Mode(7)"}, {Source{Kind: SourceFixed}.String(), "fixed"}, {Source{Kind: 42}.String(), "SourceKind(42)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestIntegral(t *testing.T) {
	for raw, want := range map[string]bool{
		"0": true, "-0": true, "10": true, "1.0": true, "1e2": true, "1E+2": true, "1500e-2": true, "0.0e-5": true,
		"1.5": false, "15e-1": false, "1e-1": false, "0.1e1": true, "1e99999999999999999999": true,
		"1e-99999999999999999999": false, "0e-99999999999999999999": true, "100e-3": false, "-2.50e1": true, "-2.55e1": false,
	} {
		if got := integral(raw); got != want {
			t.Errorf("integral(%s) = %v, want %v", raw, got, want)
		}
	}
}

// normalised is a Config with its regexes replaced by their sources, so
// that reflect.DeepEqual compares what the configuration said.
type normalised struct {
	Config  Config
	Regexes []string
	Zones   []string // a quota's time zone by name: a Location holds a cache of when it was loaded
}

func normalise(c *Config) normalised {
	n := normalised{Config: *c}
	n.Config.Rules = make([]Rule, len(c.Rules))
	for i, r := range c.Rules {
		r.Match = append([]Condition(nil), r.Match...)
		for j := range r.Match {
			re := ""
			if r.Match[j].Regex != nil {
				re = r.Match[j].Regex.String()
			}
			n.Regexes = append(n.Regexes, re)
			r.Match[j].Regex = nil
		}
		if loc := r.Limit.Calendar.Location; loc != nil {
			n.Zones = append(n.Zones, loc.String())
			r.Limit.Calendar.Location = nil
		}
		n.Config.Rules[i] = r
	}
	return n
}

// roundTrip checks that c survives MarshalJSON and Parse, and that the
// canonical form is a fixed point.
func roundTrip(t *testing.T, c *Config) {
	t.Helper()
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatalf("MarshalJSON: %v", err)
	}
	if !json.Valid(out) {
		t.Fatalf("MarshalJSON wrote invalid JSON: %s", out)
	}
	c2, err := Parse(out)
	if err != nil {
		t.Fatalf("Parse(MarshalJSON()) = %v\nfor %s", err, out)
	}
	if a, b := normalise(c), normalise(c2); !reflect.DeepEqual(a, b) {
		t.Fatalf("round trip changed the config:\nbefore %+v\n after %+v\n  json %s", a, b, out)
	}
	out2, err := c2.MarshalJSON()
	if err != nil || !bytes.Equal(out, out2) {
		t.Fatalf("MarshalJSON is not canonical:\n%s\n%s", out, out2)
	}
}

// checkValid checks the guarantees the package doc makes for every Config
// that Parse returns.
func checkValid(t *testing.T, c *Config) {
	t.Helper()
	fail := func(format string, args ...any) { t.Helper(); t.Fatalf("invalid Config accepted: "+format, args...) }
	if len(c.Rules) == 0 {
		fail("no rules")
	}
	if c.XFFNumTrustedHops < 0 || c.XFFNumTrustedHops > MaxXFFNumTrustedHops || c.MaxKeys < MinMaxKeys ||
		c.MaxKeys > MaxMaxKeys || c.Headers < HeadersBoth || c.Headers > HeadersNone ||
		c.JWTMetadataNamespace == "" || c.JWTPayloadKey == "" {
		fail("top level %+v", c)
	}
	checkService := func(s *Service) {
		if s.Cluster == "" || s.Authority == "" || !strings.HasPrefix(s.Path, "/") || s.TimeoutMS < 1 ||
			s.TimeoutMS > MaxTimeoutMS || s.FailureMode > FailDeny {
			fail("service %+v", s)
		}
	}
	if c.Service != nil {
		checkService(c.Service)
	}
	names := make(map[string]bool)
	finite := func(f float64) bool { return !math.IsInf(f, 0) && !math.IsNaN(f) }
	for i, r := range c.Rules {
		if !validName(r.Name) || names[r.Name] || (r.Group != "" && !validName(r.Group)) {
			fail("rules[%d] name %q group %q", i, r.Name, r.Group)
		}
		names[r.Name] = true
		for _, m := range r.Match {
			if m.Present == nil && m.Equals == nil && m.In == nil && m.Prefix == nil && m.Regex == nil {
				fail("rules[%d] condition without operator", i)
			}
		}
		if r.Action == ActionAllow {
			if !reflect.DeepEqual(r, Rule{Name: r.Name, Action: r.Action, Group: r.Group, Match: r.Match}) {
				fail("allow rules[%d] has more than name, group and match: %+v", i, r)
			}
			continue
		}
		l, k := r.Limit, r.Cost
		if r.Algorithm == AlgorithmConcurrency {
			if cc := r.Concurrency; cc.MaxInFlight < 1 || cc.MaxInFlight > MaxMaxInFlight || l.TokensPerSecond != 0 || l.Burst != float64(cc.MaxInFlight) ||
				(l.MaxDelayMS == 0) != (l.MaxWaiting == 0) || l.MaxDelayMS < 0 || l.MaxDelayMS > MaxDelayMS || l.MaxWaiting < 0 || l.MaxWaiting > MaxMaxWaiting ||
				k != (Cost{Source: Source{Kind: SourceFixed}, Fixed: 1, Default: 1}) || r.ChargeOn.Listed || r.Sync != SyncPerRequest ||
				(r.Scope == ScopeCluster) != (cc.TTLMS != 0) || (r.Scope == ScopeCluster) != (r.Service != nil) ||
				cc.TTLMS != 0 && (cc.TTLMS < MinSlotTTLMS || cc.TTLMS > MaxSlotTTLMS) {
				fail("concurrency rules[%d] %+v", i, r)
			}
			continue
		}
		if r.Concurrency != (Concurrency{}) || (r.Algorithm == AlgorithmQuota) != l.Quota() {
			fail("rules[%d] algorithm %v, %+v", i, r.Algorithm, r.Concurrency)
		}
		if l.Quota() {
			if l.TokensPerSecond != 0 || l.Calendar.Location == nil || l.MaxDelayMS != 0 {
				fail("rules[%d] quota %+v", i, l)
			}
			l.TokensPerSecond = l.Burst // what follows checks it as a token bucket that fills in a second
		}
		if r.Action != ActionLimit || r.Mode > ModeShadow || r.MissingKey > MissingDeny || r.Scope > ScopeCluster ||
			!finite(l.TokensPerSecond) || !finite(l.Burst) || l.TokensPerSecond <= 0 || l.Burst < l.TokensPerSecond ||
			l.Burst/l.TokensPerSecond > MaxFillSeconds || !(k.Fixed > 0 && k.Fixed <= l.Burst) ||
			!(k.Default > 0 && k.Default <= l.Burst) || r.Status < 400 || r.Status > 599 {
			fail("rules[%d] %+v", i, r)
		}
		switch k.Source.Kind {
		case SourceFixed, SourceHeader, SourceQuery, SourceResponseHeader:
			if k.MaxBodyBytes != 0 || k.Truncated != 0 {
				fail("rules[%d] max_body_bytes %d, truncated_cost %v with cost source %v", i, k.MaxBodyBytes, k.Truncated, k.Source)
			}
		case SourceResponseJSON:
			if k.MaxBodyBytes < 1 || k.MaxBodyBytes > MaxMaxBodyBytes || checkJSONPath(k.Source.Name) != nil ||
				!(k.Truncated >= MinCost && k.Truncated <= l.Burst) {
				fail("rules[%d] cost %+v", i, k)
			}
		default:
			fail("rules[%d] cost source %v", i, k.Source)
		}
		if cs := r.ChargeOn; cs.Listed && (cs.Classes == 0 && len(cs.Codes) == 0 || cs.Classes&^0b111110 != 0) ||
			!cs.Listed && (cs.Classes != 0 || cs.Codes != nil) {
			fail("rules[%d] charge_on %+v", i, cs)
		}
		for _, code := range r.ChargeOn.Codes {
			if code < 100 || code > 599 || r.ChargeOn.Classes&(1<<(code/100)) != 0 {
				fail("rules[%d] charge_on code %d", i, code)
			}
		}
		if (r.Scope == ScopeCluster) != (r.Service != nil) {
			fail("rules[%d] scope %v with service %v", i, r.Scope, r.Service)
		}
		if r.Service != nil {
			checkService(r.Service)
		}
	}
}

func TestParseStatus(t *testing.T) {
	for in, want := range map[string][2]int{"1xx": {1, 0}, "5xx": {5, 0}, "100": {0, 100}, "401": {0, 401}, "599": {0, 599}} {
		class, code, err := parseStatus(in)
		if err != nil || [2]int{class, code} != want {
			t.Errorf("parseStatus(%q) = %d, %d, %v; want %v", in, class, code, err, want)
		}
	}
	for _, in := range []string{"", "2", "20", "2000", "0xx", "6xx", "600", "099", "2Xx", " 200", "x00", "4x1", "+20"} {
		if _, _, err := parseStatus(in); err == nil {
			t.Errorf("parseStatus(%q) accepted", in)
		}
	}
}

// FuzzParseStatus: whatever parseStatus accepts is exactly a class 1..5
// written "nxx" or a status 100..599 written in three digits, and the
// StatusSet built from it holds what it should.
func FuzzParseStatus(f *testing.F) {
	for _, s := range []string{"2xx", "401", "599", "6xx", "099", "", "2XX", "40１"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		class, code, err := parseStatus(s)
		if err != nil {
			if !strings.Contains(err.Error(), strconvQuote(s)) {
				t.Fatalf("parseStatus(%q): error %q does not quote the input", s, err)
			}
			return
		}
		switch {
		case class > 0:
			if class > 5 || code != 0 || s != string(rune('0'+class))+"xx" {
				t.Fatalf("parseStatus(%q) = class %d, code %d", s, class, code)
			}
			set := StatusSet{Listed: true, Classes: 1 << class}
			if !set.Has(class*100) || !set.Has(class*100+99) || set.Has(class*100+100) || set.Has(class*100-1) {
				t.Fatalf("class %d: Has is wrong", class)
			}
		default:
			if code < 100 || code > 599 || s != itoa(code) {
				t.Fatalf("parseStatus(%q) = class %d, code %d", s, class, code)
			}
			set := StatusSet{Listed: true, Codes: []int{code}}
			if !set.Has(code) || set.Has(code+1) {
				t.Fatalf("code %d: Has is wrong", code)
			}
		}
	})
}

func FuzzParse(f *testing.F) {
	for _, tc := range goodCases {
		f.Add([]byte(tc.in))
	}
	for _, tc := range badCases {
		f.Add([]byte(tc.in))
	}
	for _, ex := range referenceExamples() {
		f.Add([]byte(ex))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		// gjson and encoding/json must agree on what is JSON (for documents
		// shallow enough to reach the parser).
		notJSON := err != nil && strings.HasPrefix(err.Error(), "config: invalid JSON")
		tooDeep := err != nil && strings.HasSuffix(err.Error(), "nested deeper than 32 levels")
		if utf8.Valid(data) && !tooDeep && notJSON == json.Valid(data) {
			t.Fatalf("Parse(%q) = %v, but json.Valid = %v", data, err, json.Valid(data))
		}
		if err != nil {
			var e *Error
			if c != nil || !errors.As(err, &e) || !strings.HasPrefix(err.Error(), "config: ") {
				t.Fatalf("Parse(%q) = %v, %v", data, c, err)
			}
			return
		}
		checkValid(t, c)
		roundTrip(t, c)
	})
}

// BenchmarkParse measures loading a configuration of a few realistic rules
// (done once per worker when the plugin starts, never per request).
func BenchmarkParse(b *testing.B) {
	var data []byte
	for _, tc := range goodCases {
		if tc.name == "tiers, an allow-list and shadow" {
			data = []byte(tc.in)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

func strconvQuote(s string) string { return strconv.Quote(s) }

func itoa(n int) string { return strconv.Itoa(n) }

// TestServiceDiffNamesEveryField: a change to any one field of Service is
// named by serviceDiff, so the error for two cluster rules with different
// services always says which field differs, whatever fields Service gains.
func TestServiceDiffNamesEveryField(t *testing.T) {
	base := Service{Cluster: "c", Authority: "c", Path: "/v1/decide", LeasePath: "/v1/lease", ChargePath: "/v1/charge", TimeoutMS: 25}
	typ := reflect.TypeOf(base)
	seen := map[string]bool{}
	for i := 0; i < typ.NumField(); i++ {
		other := base
		f := reflect.ValueOf(&other).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Int:
			f.SetInt(f.Int() + 1)
		default:
			t.Fatalf("Service.%s: kind %v: teach this test to change it", typ.Field(i).Name, f.Kind())
		}
		name, a, b := serviceDiff(&base, &other)
		if name == "" || a == b {
			t.Errorf("Service.%s changed: serviceDiff = %q, %q, %q: want the field's JSON name and two values", typ.Field(i).Name, name, a, b)
		}
		if seen[name] {
			t.Errorf("Service.%s: serviceDiff names %q, as for another field", typ.Field(i).Name, name)
		}
		seen[name] = true
	}
	if name, _, _ := serviceDiff(&base, &base); name != "" {
		t.Errorf("serviceDiff of equal services = %q, want none", name)
	}
}

// TestParseDelay: max_delay_ms defaults to 0 (refuse, as before) and
// max_waiting to DefaultMaxWaiting once a rule holds requests; a rule that
// holds may have a burst below its rate.
func TestParseDelay(t *testing.T) {
	for _, tt := range []struct {
		alg                 string
		wantDelay, wantWait int
	}{
		{`"tokens_per_second":10,"burst":10`, 0, 0},
		{`"tokens_per_second":10,"burst":1,"max_delay_ms":1000`, 1000, DefaultMaxWaiting},
		{`"tokens_per_second":10,"burst":1,"max_delay_ms":1000,"max_waiting":7`, 1000, 7},
	} {
		c, err := Parse([]byte(doc("", alg(tt.alg))))
		if err != nil {
			t.Fatalf("%s: %v", tt.alg, err)
		}
		if l := c.Rules[0].Limit; l.MaxDelayMS != tt.wantDelay || l.MaxWaiting != tt.wantWait {
			t.Errorf("%s: Limit = %+v, want max_delay_ms %d, max_waiting %d", tt.alg, l, tt.wantDelay, tt.wantWait)
		}
	}
	// A leased cluster rule holds requests on its lease (a burst below the
	// rate with them, as a local rule).
	c, err := Parse([]byte(doc(`"service":{"cluster":"c"}`, `{"name":"r","scope":"cluster","sync":"lease","algorithm":"token_bucket","algorithm_config":{"tokens_per_second":10,"burst":1,"max_delay_ms":1000}}`)))
	if err != nil {
		t.Fatalf("leased: %v", err)
	}
	if r := c.Rules[0]; r.Sync != SyncLease || r.Limit.MaxDelayMS != 1000 || r.Limit.MaxWaiting != DefaultMaxWaiting {
		t.Errorf("leased: sync %v, Limit = %+v; want lease, max_delay_ms 1000", r.Sync, r.Limit)
	}
}
