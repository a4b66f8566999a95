package config

import (
	"errors"
	"strconv"
	"unicode/utf8"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
)

// Defaults and bounds of the configuration. docs/configuration.md and
// schema.json repeat them; the tests keep the three in agreement.
const (
	DefaultJWTMetadataNamespace = "envoy.filters.http.jwt_authn"
	DefaultJWTPayloadKey        = "jwt_payload"
	DefaultMaxKeys              = 100000
	MinMaxKeys                  = 16
	MaxMaxKeys                  = 10000000
	MaxXFFNumTrustedHops        = 16
	DefaultStatus               = 429
	DefaultServicePath          = "/v1/decide"
	DefaultLeasePath            = "/v1/lease"
	DefaultChargePath           = "/v1/charge"
	DefaultTimeoutMS            = 25
	MaxTimeoutMS                = 60000
	// DefaultLeaseTimeoutMS is lease_timeout_ms when timeout_ms is below
	// it (docs/configuration.md says why).
	DefaultLeaseTimeoutMS = 500
	// MinKeySecretBytes is the shortest service.key_secret.
	MinKeySecretBytes = 16

	// Lease tuning of a cluster rule with "sync": "lease" (its "lease"
	// object): ttl_ms, how long leased tokens stay with this Envoy after
	// the last grant before they go back to the limit service, and
	// max_share, the largest fraction of the burst one lease may hold.
	DefaultLeaseTTLMS = 2000
	MinLeaseTTLMS     = 100
	MaxLeaseTTLMS     = 60000
	DefaultLeaseShare = 0.25
	MaxLeaseShare     = 0.5

	// MaxTokensPerSecond bounds tokens_per_second (and rps).
	MaxTokensPerSecond = 1e9
	// MaxBurst bounds burst, fixed_cost and default_cost.
	MaxBurst = 1e12
	// MaxFillSeconds bounds burst / tokens_per_second, the time an empty
	// bucket takes to fill: one year (365 days). It keeps every wait the
	// plugin computes, in seconds or in nanoseconds, far inside int64.
	// Cluster rules are bounded by the limit service's tighter wire bounds
	// (wire.MaxAmount, wire.MaxFill).
	MaxFillSeconds = 365 * 24 * 3600
	// MinCost is the smallest cost a request can take: fixed_cost and
	// default_cost below it are refused, and a cost header or parameter
	// below it (zero, negative, or a tiny value such as 1e-300) is not a
	// cost, so default_cost applies, as for any malformed value.
	MinCost = 0.001

	// MaxDelayMS bounds algorithm_config.max_delay_ms, the longest a
	// request may be held for its tokens: one minute (bucket.MaxWait,
	// wire.MaxDelayMs).
	MaxDelayMS = 60_000
	// DefaultMaxWaiting is max_waiting's default, and MaxMaxWaiting its
	// bound: the most requests one rule holds at once on one worker (native
	// module) or in one VM (Wasm plugin). Each held request keeps its
	// stream open in Envoy and a few hundred bytes in the plugin
	// (docs/configuration.md states the measured figure).
	DefaultMaxWaiting = 1024
	MaxMaxWaiting     = 100_000

	// DefaultMaxBodyBytes is max_body_bytes's default (1 MiB), and
	// MaxMaxBodyBytes its bound (16 MiB): the most of a response body a
	// response_json cost keeps in the plugin's memory per response.
	DefaultMaxBodyBytes = 1 << 20
	MaxMaxBodyBytes     = 16 << 20

	// MaxDepth bounds the nesting of the configuration document (a real
	// one needs 6 levels); deeper documents are refused before any
	// recursive parser sees them.
	MaxDepth = 32
	// RegexBudget bounds the work of one regex condition on one request:
	// the value bytes it reads times the instructions of its compiled
	// program (Go's regexp runs in time proportional to that product). A
	// regex reads at most min(MaxRegexInput, RegexBudget / instructions)
	// bytes of a value (Condition.RegexMaxInput); a longer value does not
	// match, and the plugin counts it.
	RegexBudget = 16384
	// MaxRegexInput is the most bytes of a value any regex reads.
	MaxRegexInput = 4096
	// MaxRegexInstructions bounds a regex's compiled program, so that it
	// reads at least RegexBudget / MaxRegexInstructions (163) bytes.
	MaxRegexInstructions = 100
	// MaxRegexConditions bounds the regex conditions of a configuration:
	// with RegexBudget, it bounds the regex work of one request.
	MaxRegexConditions = 8
)

// Error is a configuration error: the JSON path of the offending value and
// the reason. Its text is "config: <path>: <reason>", or "config: <reason>"
// when the error concerns the document as a whole.
type Error struct {
	// Path is the JSON path of the value, e.g. rules[1].algorithm_config.burst
	// or rules[0].match["header:x-plan"].regex; empty for the whole document.
	Path string
	Err  error
}

// Error implements error.
func (e *Error) Error() string {
	if e.Path == "" {
		return "config: " + e.Err.Error()
	}
	return "config: " + e.Path + ": " + e.Err.Error()
}

// Unwrap returns the reason, for errors.Is and errors.As.
func (e *Error) Unwrap() error { return e.Err }

// errorf is the error at path with the reason msg. Messages are built with
// strconv rather than fmt, which the plugin's Wasm module would otherwise
// carry for them alone (bench/footprint.md).
func errorf(path, msg string) error {
	return &Error{Path: path, Err: errors.New(msg)}
}

// fieldError is the reading layer's refusal e as an *Error; nil when e is.
// Out of line, as jsonfield.Refuse says why.
//
//go:noinline
func fieldError(e *jsonfield.Error) error {
	if e == nil {
		return nil
	}
	return &Error{Path: e.Path, Err: errors.New(e.Msg)}
}

// wrapError is prefix + err's text, and unwraps to err (fmt.Errorf's %w).
type wrapError struct {
	prefix string
	err    error
}

func (e *wrapError) Error() string { return e.prefix + e.err.Error() }
func (e *wrapError) Unwrap() error { return e.err }

// Parse parses and validates a configuration. It returns the first error
// found, as an *Error naming the JSON path; a Config it returns is fully
// valid, with every default filled in.
func Parse(data []byte) (*Config, error) {
	if !utf8.Valid(data) {
		return nil, &Error{Err: errors.New("invalid JSON: not valid UTF-8")}
	}
	doc, ferr := jsonfield.Parse(data, MaxDepth)
	if ferr != nil {
		return nil, fieldError(ferr)
	}
	if !doc.IsObject() {
		return nil, &Error{Err: errors.New("the configuration must be a JSON object, got " + jsonfield.Kind(doc))}
	}
	top, err := fields("", doc, "rules", "xff_num_trusted_hops", "trust_unverified_jwt",
		"jwt_metadata_namespace", "jwt_payload_key", "mode", "headers", "max_keys", "scope", "service")
	if err != nil {
		return nil, err
	}
	c := &Config{
		JWTMetadataNamespace: DefaultJWTMetadataNamespace,
		JWTPayloadKey:        DefaultJWTPayloadKey,
		Headers:              HeadersBoth,
		MaxKeys:              DefaultMaxKeys,
	}
	if c.XFFNumTrustedHops, err = top.integer("xff_num_trusted_hops", 0, 0, MaxXFFNumTrustedHops); err != nil {
		return nil, err
	}
	if c.TrustUnverifiedJWT, err = top.boolean("trust_unverified_jwt", false); err != nil {
		return nil, err
	}
	if c.JWTMetadataNamespace, err = top.text("jwt_metadata_namespace", c.JWTMetadataNamespace); err != nil {
		return nil, err
	}
	if c.JWTPayloadKey, err = top.text("jwt_payload_key", c.JWTPayloadKey); err != nil {
		return nil, err
	}
	var d defaults
	mode, err := top.enum("mode", modeNames, int(ModeEnforce))
	if err != nil {
		return nil, err
	}
	d.mode = Mode(mode)
	headers, err := top.enum("headers", headerStyleNames, int(HeadersBoth))
	if err != nil {
		return nil, err
	}
	c.Headers = HeaderStyle(headers)
	if c.MaxKeys, err = top.integer("max_keys", DefaultMaxKeys, MinMaxKeys, MaxMaxKeys); err != nil {
		return nil, err
	}
	scope, err := top.enum("scope", scopeNames, int(ScopeLocal))
	if err != nil {
		return nil, err
	}
	d.scope = Scope(scope)
	if v, ok := top.get("service"); ok {
		if c.Service, err = parseService("service", v); err != nil {
			return nil, err
		}
	}
	d.service = c.Service

	v, ok := top.get("rules")
	if !ok {
		return nil, errorf("rules", "required")
	}
	rules, err := array("rules", v)
	if err != nil {
		return nil, err
	}
	names := make(map[string]int)
	for i, rv := range rules {
		r, err := parseRule(jsonfield.Elem("rules", i), rv, d)
		if err != nil {
			return nil, err
		}
		if j, dup := names[r.Name]; dup {
			return nil, errorf("rules["+strconv.Itoa(i)+"].name", strconv.Quote(r.Name)+" is already the name of rules["+strconv.Itoa(j)+"]")
		}
		names[r.Name] = i
		c.Rules = append(c.Rules, r)
	}
	if len(c.Rules) == 0 {
		return nil, errorf("rules", "must hold at least one rule")
	}
	if err := checkClusterRules(c.Rules); err != nil {
		return nil, err
	}
	if err := checkRegexes(c.Rules); err != nil {
		return nil, err
	}
	return c, nil
}

// defaults are the top-level values a rule inherits.
type defaults struct {
	mode    Mode
	scope   Scope
	service *Service
}
