// Package config parses, validates and marshals the plugin's JSON
// configuration: the string given to the Wasm filter in Envoy (or to an Istio
// WasmPlugin). docs/configuration.md is the user's reference; schema.json is
// the same model as a JSON Schema (draft 2020-12), kept in agreement with
// Parse by schema_test.go.
//
// # Model
//
// A configuration is an ordered list of rules plus a few process-wide
// settings. A rule with action "limit" (the default) is a token bucket
// (tokens_per_second, burst) per value of its limit keys (a composite of
// request sources such as header:x-api-key, ip:address or jwt:org.id; none
// means one bucket for all requests the rule applies to), or with algorithm
// "quota" a limit spent over each calendar period of a time zone and full
// again at each boundary (Limit.Calendar, package calendar; Burst is the
// limit, TokensPerSecond 0). A rule applies to
// a request when every condition of its match holds. Each request costs a
// fixed number of tokens, or a number read from a header or query parameter,
// or one known only from the response (a header, or a JSON path in the body;
// docs/response-costs.md). A rule with action "allow" takes only name, group
// and match: when it matches, the rules after it do not apply. Rules sharing
// a group form a tier: only the first of them that applies counts. A member
// applies when it matches and either is an allow rule, or yields a bucket
// (its limit keys are all present, or missing_key is "shared"), or rejects
// for missing_key "deny"; a member that matches but lacks a limit key with
// missing_key "skip" does not apply, and the next member is tried (so a
// client cannot leave a tier by leaving out a key). Every other applicable
// rule is stacked: all must allow. Scope "local" keeps buckets in this
// Envoy's shared data; scope "cluster" asks a limit service through an Envoy
// cluster.
//
// Top-level "mode", "scope" and "service" are defaults that Parse resolves
// into each limit rule (Rule.Mode, Rule.Scope, Rule.Service); a cluster rule
// without its own service points at Config.Service. Allow rules have no mode,
// scope or bucket: their Mode, Scope, Limit, Cost, Status and the rest are
// zero values.
//
// # Defaults
//
// xff_num_trusted_hops 0, trust_unverified_jwt false, jwt_metadata_namespace
// "envoy.filters.http.jwt_authn", jwt_payload_key "jwt_payload", mode
// "enforce", headers "both", max_keys 100000, scope "local"; per rule: action
// "limit", limit_keys none, missing_key "skip", cost_source "fixed",
// fixed_cost 1, default_cost 1, truncated_cost burst (response_json only),
// max_body_bytes 1 MiB (response_json only), status 429, body "" (the
// plugin's default JSON body); per service: authority = cluster, path
// "/v1/decide", timeout_ms 25, lease_timeout_ms the larger of 500 and
// timeout_ms, failure_mode "allow".
//
// # Guarantees
//
// Parse accepts exactly the documented shape: unknown or repeated fields,
// wrong JSON types, non-integers where an integer is needed, out-of-range
// numbers, malformed sources, uncompilable regexes, invalid UTF-8 and
// invalid JSON are errors. Errors are *Error values whose text is
// "config: <JSON path>: <reason>", for example
//
//	config: rules[1].algorithm_config.burst: must be >= tokens_per_second (10), got 5
//
// and Parse reports the first one in a fixed order. Before any recursive
// parser sees the document, its nesting is bounded (MaxDepth): a deeper one
// is refused with the path of the first value too deep. A Config that Parse
// returned is fully valid: every default is filled in, every enumeration
// holds a defined value, every rate, burst and cost is finite and positive
// (but a quota's rate, which is 0, and its Calendar is a valid Spec),
// burst >= tokens_per_second, fixed_cost, default_cost and truncated_cost
// <= burst, an empty bucket refills within a year, rule names are unique and
// safe in stats names and headers, every cluster rule has a Service and every local rule has
// none, every Condition has at least one operator and compiled regex, every
// regex compiles to at most MaxRegexInstructions and reads at most
// RegexMaxInput bytes of a value (at most MaxRegexConditions of them), every
// fixed, default and truncated cost is at least MinCost, and every cluster
// rule uses the one service of all cluster rules, within the limit service's
// bounds (package wire). Whatever the plugin would refuse, Parse refuses.
// Users need not validate it again.
//
// A Config is immutable after Parse and safe for concurrent reads.
package config
