package config

import (
	"errors"
	"math"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
	"github.com/ratelimit-wasm/tokenbucket/internal/jsonlimit"
	"github.com/ratelimit-wasm/tokenbucket/wire"
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
// carry for them alone (docs/benchmarks/footprint.md).
func errorf(path, msg string) error {
	return &Error{Path: path, Err: errors.New(msg)}
}

// fieldError is the reading layer's refusal e as an *Error; nil when e is.
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

// checkClusterRules enforces what one request's callout needs: every
// cluster rule (enforced or shadow) names the same service, since one
// callout carries all of a request's cluster buckets, and there are no more
// of them than the service takes in one decision.
func checkClusterRules(rules []Rule) error {
	var first *Rule
	firstIdx, n := 0, 0
	for i := range rules {
		r := &rules[i]
		if r.Scope != ScopeCluster || r.Action != ActionLimit {
			continue
		}
		n++
		if n > wire.MaxBuckets {
			return errorf("rules["+strconv.Itoa(i)+"].scope", "at most "+strconv.Itoa(wire.MaxBuckets)+" cluster rules (the buckets one limit-service decision takes)")
		}
		if first == nil {
			first, firstIdx = r, i
			continue
		}
		if *r.Service != *first.Service {
			const msg = "every cluster rule must use the same service (one callout per request carries them all): "
			at, this := jsonfield.Elem("rules", firstIdx), jsonfield.Elem("rules", i)
			field, a, b := serviceDiff(first.Service, r.Service)
			if field == "token" {
				return errorf(this+".service.token", msg+at+" and "+this+" have different tokens")
			}
			return errorf(this+".service."+field, msg+at+" has "+a+", "+this+" has "+b)
		}
	}
	return nil
}

// serviceFields are the fields of Service by their JSON names, each with
// its value as the configuration spells it (TestServiceDiffNamesEveryField
// fails when a field of Service is missing here).
var serviceFields = [...]struct {
	name  string
	value func(*Service) string
}{
	{"cluster", func(s *Service) string { return strconv.Quote(s.Cluster) }},
	{"authority", func(s *Service) string { return strconv.Quote(s.Authority) }},
	{"path", func(s *Service) string { return strconv.Quote(s.Path) }},
	{"lease_path", func(s *Service) string { return strconv.Quote(s.LeasePath) }},
	{"charge_path", func(s *Service) string { return strconv.Quote(s.ChargePath) }},
	{"timeout_ms", func(s *Service) string { return strconv.Itoa(s.TimeoutMS) }},
	{"failure_mode", func(s *Service) string { return strconv.Quote(failureModeNames[s.FailureMode]) }},
	{"token", func(s *Service) string { return strconv.Quote(s.Token) }},
}

// serviceDiff returns the JSON name of the first field in which a and b
// differ, with its two values ("" when they are equal). A token's values
// are secrets: callers must not print them.
func serviceDiff(a, b *Service) (field, av, bv string) {
	for _, f := range serviceFields {
		if x, y := f.value(a), f.value(b); x != y {
			return f.name, x, y
		}
	}
	return "", "", ""
}

// checkRegexes bounds what the regexes of a configuration may cost a
// request: each regex condition sees at most Condition.RegexMaxInput bytes
// of a value (RegexBudget NFA steps), and there are at most
// MaxRegexConditions of them.
func checkRegexes(rules []Rule) error {
	n := 0
	for i := range rules {
		for j := range rules[i].Match {
			if rules[i].Match[j].Regex == nil {
				continue
			}
			if n++; n > MaxRegexConditions {
				return errorf(jsonlimit.Join("rules["+strconv.Itoa(i)+"].match", rules[i].Match[j].Source.String())+".regex", "at most "+strconv.Itoa(MaxRegexConditions)+" regex conditions in a configuration (each costs a request up to "+strconv.Itoa(RegexBudget)+" steps)")
			}
		}
	}
	return nil
}

// defaults are the top-level values a rule inherits.
type defaults struct {
	mode    Mode
	scope   Scope
	service *Service
}

var ruleFields = []string{"name", "action", "mode", "group", "limit_keys", "match", "missing_key",
	"algorithm", "algorithm_config", "charge_on", "status", "body", "response_headers", "scope", "service", "sync", "lease"}

// allowRuleFields are the only fields a rule with action "allow" may have.
var allowRuleFields = []string{"name", "action", "group", "match"}

// validName reports whether s is a valid rule or group name: 1 to 64 of
// A-Z a-z 0-9 _ . - (the regexp ^[A-Za-z0-9_.-]{1,64}$, written out so
// every VM does not compile it at start).
func validName(s string) bool {
	if len(s) < 1 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

func parseRule(path string, v gjson.Result, d defaults) (Rule, error) {
	var r Rule
	o, err := fields(path, v, ruleFields...)
	if err != nil {
		return r, err
	}
	nv, ok := o.get("name")
	if !ok {
		return r, errorf(path+".name", "required")
	}
	if r.Name, err = str(path+".name", nv); err != nil {
		return r, err
	}
	if !validName(r.Name) {
		return r, errorf(path+".name", "must be 1 to 64 of A-Z a-z 0-9 _ . -, got "+strconv.Quote(r.Name))
	}
	action, err := o.enum("action", actionNames, int(ActionLimit))
	if err != nil {
		return r, err
	}
	r.Action = Action(action)
	if v, ok := o.get("group"); ok {
		if r.Group, err = str(path+".group", v); err != nil {
			return r, err
		}
		if !validName(r.Group) {
			return r, errorf(path+".group", "must be 1 to 64 of A-Z a-z 0-9 _ . -, got "+strconv.Quote(r.Group))
		}
	}
	if v, ok := o.get("match"); ok {
		if r.Match, err = parseMatch(path+".match", v); err != nil {
			return r, err
		}
	}
	if r.Action == ActionAllow {
		for _, name := range o.order {
			if !slices.Contains(allowRuleFields, name) {
				return r, errorf(jsonlimit.Join(path, name), "not allowed with action \"allow\" (an allow rule takes only name, action, group and match)")
			}
		}
		return r, nil
	}

	mode, err := o.enum("mode", modeNames, int(d.mode))
	if err != nil {
		return r, err
	}
	r.Mode = Mode(mode)
	if v, ok := o.get("limit_keys"); ok {
		if r.LimitKeys, err = parseLimitKeys(path+".limit_keys", v); err != nil {
			return r, err
		}
	}
	missing, err := o.enum("missing_key", missingKeyNames, int(MissingSkip))
	if err != nil {
		return r, err
	}
	r.MissingKey = MissingKey(missing)
	av, ok := o.get("algorithm")
	if !ok {
		return r, errorf(path+".algorithm", "required for action \"limit\"")
	}
	algorithm, err := str(path+".algorithm", av)
	if err != nil {
		return r, err
	}
	if algorithm != "token_bucket" {
		return r, errorf(path+".algorithm", "must be \"token_bucket\", got "+strconv.Quote(algorithm))
	}
	cv, ok := o.get("algorithm_config")
	if !ok {
		return r, errorf(path+".algorithm_config", "required for action \"limit\"")
	}
	if r.Limit, r.Cost, err = parseAlgorithmConfig(path+".algorithm_config", cv); err != nil {
		return r, err
	}
	if v, ok := o.get("charge_on"); ok {
		if r.ChargeOn, err = parseChargeOn(path+".charge_on", v); err != nil {
			return r, err
		}
	}
	if r.Status, err = o.integer("status", DefaultStatus, 400, 599); err != nil {
		return r, err
	}
	if v, ok := o.get("body"); ok {
		if r.Body, err = str(path+".body", v); err != nil {
			return r, err
		}
	}
	if v, ok := o.get("response_headers"); ok {
		if r.ResponseHeaders, err = parseResponseHeaders(path+".response_headers", v); err != nil {
			return r, err
		}
	}
	scope, err := o.enum("scope", scopeNames, int(d.scope))
	if err != nil {
		return r, err
	}
	r.Scope = Scope(scope)
	sv, hasService := o.get("service")
	switch {
	case hasService && r.Scope != ScopeCluster:
		return r, errorf(path+".service", "only allowed with scope \"cluster\"")
	case hasService:
		if r.Service, err = parseService(path+".service", sv); err != nil {
			return r, err
		}
	case r.Scope == ScopeCluster:
		if d.service == nil {
			return r, errorf(path+".service", "required with scope \"cluster\" (on the rule or at the top level)")
		}
		r.Service = d.service
	}
	if r.Scope == ScopeCluster {
		if err := checkWireBounds(path+".algorithm_config", r.Limit); err != nil {
			return r, err
		}
	}
	return r, parseSync(path, o, &r)
}

// parseSync reads a cluster rule's "sync" and "lease".
func parseSync(path string, o object, r *Rule) error {
	_, hasSync := o.get("sync")
	lv, hasLease := o.get("lease")
	if hasSync && r.Scope != ScopeCluster {
		return errorf(path+".sync", "only allowed with scope \"cluster\"")
	}
	sync, err := o.enum("sync", syncNames, int(SyncPerRequest))
	if err != nil {
		return err
	}
	r.Sync = Sync(sync)
	switch {
	case r.Sync == SyncLease && r.Mode == ModeShadow:
		return errorf(path+".sync", "\"lease\" is for enforced rules: a shadow rule is sent per request, to measure what it would do")
	case hasLease && r.Sync != SyncLease:
		return errorf(path+".lease", "only allowed with sync \"lease\"")
	case r.Sync != SyncLease:
		return nil
	}
	r.Lease = Lease{TTLMS: DefaultLeaseTTLMS, MaxShare: DefaultLeaseShare}
	if !hasLease {
		return nil
	}
	lo, err := fields(path+".lease", lv, "ttl_ms", "max_share")
	if err != nil {
		return err
	}
	if r.Lease.TTLMS, err = lo.integer("ttl_ms", DefaultLeaseTTLMS, MinLeaseTTLMS, MaxLeaseTTLMS); err != nil {
		return err
	}
	if _, ok := lo.get("max_share"); ok {
		if r.Lease.MaxShare, err = lo.positive("max_share", MaxLeaseShare); err != nil {
			return err
		}
	}
	return nil
}

// checkWireBounds refuses a cluster rule's limit that the limit service
// would refuse on every request (package wire holds the bounds both use).
func checkWireBounds(path string, l Limit) error {
	if l.Burst > wire.MaxAmount {
		return errorf(path+".burst", "must be at most "+fmtFloat(wire.MaxAmount)+" for a cluster rule (the limit service's bound), got "+fmtFloat(l.Burst))
	}
	if fill := l.Burst / l.TokensPerSecond; fill > wire.MaxFill.Seconds() {
		return errorf(path+".burst", "burst / tokens_per_second is "+fmtFloat(fill)+" seconds to refill, more than the limit service accepts for a cluster rule ("+fmtFloat(wire.MaxFill.Seconds())+" seconds)")
	}
	return nil
}

func parseLimitKeys(path string, v gjson.Result) ([]Source, error) {
	items, err := array(path, v)
	if err != nil {
		return nil, err
	}
	var keys []Source
	seen := make(map[Source]int)
	for i, kv := range items {
		p := jsonfield.Elem(path, i)
		s, err := str(p, kv)
		if err != nil {
			return nil, err
		}
		src, err := parseSource(s)
		if err != nil {
			return nil, &Error{Path: p, Err: err}
		}
		if j, dup := seen[src]; dup {
			return nil, errorf(p, strconv.Quote(src.String())+" repeats "+jsonfield.Elem(path, j))
		}
		seen[src] = i
		keys = append(keys, src)
	}
	return keys, nil
}

var operators = []string{"present", "equals", "in", "prefix", "regex"}

func parseMatch(path string, v gjson.Result) ([]Condition, error) {
	ms, err := members(path, v)
	if err != nil {
		return nil, err
	}
	var conds []Condition
	seen := make(map[Source]bool)
	for _, m := range ms {
		p := jsonlimit.Join(path, m.key)
		src, err := parseSource(m.key)
		if err != nil {
			return nil, &Error{Path: p, Err: err}
		}
		if seen[src] {
			return nil, errorf(p, "a second condition on "+strconv.Quote(src.String()))
		}
		seen[src] = true
		ops, err := members(p, m.value)
		if err != nil {
			return nil, err
		}
		if len(ops) == 0 {
			return nil, errorf(p, "needs at least one of present, equals, in, prefix, regex")
		}
		c := Condition{Source: src}
		for _, op := range ops {
			if !slices.Contains(operators, op.key) {
				return nil, errorf(jsonlimit.Join(p, op.key), "unknown operator (want present, equals, in, prefix or regex)")
			}
		}
		o := object{path: p, fields: make(map[string]gjson.Result)}
		for _, op := range ops {
			o.fields[op.key] = op.value
			o.order = append(o.order, op.key)
		}
		if v, ok := o.get("present"); ok {
			b, err := boolean(p+".present", v)
			if err != nil {
				return nil, err
			}
			c.Present = &b
		}
		if c.Equals, err = o.optString("equals"); err != nil {
			return nil, err
		}
		if v, ok := o.get("in"); ok {
			in, err := array(p+".in", v)
			if err != nil {
				return nil, err
			}
			for i, e := range in {
				s, err := str(jsonfield.Elem(p+".in", i), e)
				if err != nil {
					return nil, err
				}
				c.In = append(c.In, s)
			}
			if len(c.In) == 0 {
				return nil, errorf(p+".in", "must hold at least one value")
			}
		}
		if c.Prefix, err = o.optString("prefix"); err != nil {
			return nil, err
		}
		re, err := o.optString("regex")
		if err != nil {
			return nil, err
		}
		if re != nil {
			if c.Regex, err = regexp.Compile(*re); err != nil {
				return nil, &Error{Path: p + ".regex", Err: err}
			}
			insts, err := regexInstructions(*re)
			if err != nil {
				return nil, &Error{Path: p + ".regex", Err: err}
			}
			if insts > MaxRegexInstructions {
				return nil, errorf(p+".regex", "compiles to "+strconv.Itoa(insts)+" instructions, more than "+strconv.Itoa(MaxRegexInstructions)+": it could read only "+strconv.Itoa(RegexBudget/insts)+" bytes of a value (see RegexBudget); use a shorter pattern or a prefix/in condition")
			}
			c.RegexMaxInput = min(MaxRegexInput, RegexBudget/insts)
		}
		if c.Present != nil && !*c.Present && len(ops) > 1 {
			return nil, errorf(p+".present", "false cannot be combined with equals, in, prefix or regex")
		}
		conds = append(conds, c)
	}
	return conds, nil
}

// regexInstructions is the size of the program Go's regexp runs for re.
func regexInstructions(re string) (int, error) {
	tree, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return 0, err
	}
	prog, err := syntax.Compile(tree.Simplify())
	if err != nil {
		return 0, err
	}
	return len(prog.Inst), nil
}

func parseAlgorithmConfig(path string, v gjson.Result) (Limit, Cost, error) {
	var l Limit
	c := Cost{Source: Source{Kind: SourceFixed}, Fixed: 1, Default: 1}
	o, err := fields(path, v, "tokens_per_second", "rps", "burst", "cost_source", "fixed_cost", "default_cost", "truncated_cost", "max_body_bytes")
	if err != nil {
		return l, c, err
	}
	rateName := "tokens_per_second"
	_, hasTPS := o.get("tokens_per_second")
	_, hasRPS := o.get("rps")
	switch {
	case hasTPS && hasRPS:
		return l, c, errorf(path+".rps", "cannot be combined with tokens_per_second (rps is its alias)")
	case hasRPS:
		rateName = "rps"
	case !hasTPS:
		return l, c, errorf(path+".tokens_per_second", "required (or its alias rps)")
	}
	if l.TokensPerSecond, err = o.positive(rateName, MaxTokensPerSecond); err != nil {
		return l, c, err
	}
	if _, ok := o.get("burst"); !ok {
		return l, c, errorf(path+".burst", "required")
	}
	if l.Burst, err = o.positive("burst", MaxBurst); err != nil {
		return l, c, err
	}
	if l.Burst < l.TokensPerSecond {
		return l, c, errorf(path+".burst", "must be >= "+rateName+" ("+fmtFloat(l.TokensPerSecond)+"), got "+fmtFloat(l.Burst))
	}
	if fill := l.Burst / l.TokensPerSecond; fill > MaxFillSeconds {
		return l, c, errorf(path+".burst", "burst / "+rateName+" is "+fmtFloat(fill)+" seconds to refill, more than one year ("+strconv.Itoa(MaxFillSeconds)+")")
	}
	if v, ok := o.get("cost_source"); ok {
		s, err := str(path+".cost_source", v)
		if err != nil {
			return l, c, err
		}
		if c.Source, err = parseCostSource(s); err != nil {
			return l, c, &Error{Path: path + ".cost_source", Err: err}
		}
	}
	if _, ok := o.get("truncated_cost"); ok && c.Source.Kind != SourceResponseJSON {
		return l, c, errorf(path+".truncated_cost", "only with cost_source response_json:<path> (the only cost a response can cut short)")
	}
	for _, f := range []struct {
		name string
		dst  *float64
	}{{"fixed_cost", &c.Fixed}, {"default_cost", &c.Default}, {"truncated_cost", &c.Truncated}} {
		if _, ok := o.get(f.name); !ok {
			continue
		}
		if *f.dst, err = o.positive(f.name, MaxBurst); err != nil {
			return l, c, err
		}
		if *f.dst < MinCost {
			return l, c, errorf(path+"."+f.name, "must be at least "+fmtFloat(MinCost)+" (MinCost), got "+fmtFloat(*f.dst))
		}
		if *f.dst > l.Burst {
			return l, c, errorf(path+"."+f.name, "must be <= burst ("+fmtFloat(l.Burst)+"), got "+fmtFloat(*f.dst)+": such a request could never pass")
		}
	}
	if _, ok := o.get("max_body_bytes"); ok && c.Source.Kind != SourceResponseJSON {
		return l, c, errorf(path+".max_body_bytes", "only with cost_source response_json:<path> (the only cost read from a body)")
	}
	if c.Source.Kind == SourceResponseJSON {
		if _, ok := o.get("truncated_cost"); !ok {
			c.Truncated = l.Burst // the most one request may cost
		}
		if c.MaxBodyBytes, err = o.integer("max_body_bytes", DefaultMaxBodyBytes, 1, MaxMaxBodyBytes); err != nil {
			return l, c, err
		}
	}
	return l, c, nil
}

// parseChargeOn parses a rule's charge_on: a non-empty array of status
// classes ("2xx") and exact statuses ("401"), none repeated or inside a
// class also listed.
func parseChargeOn(path string, v gjson.Result) (StatusSet, error) {
	s := StatusSet{Listed: true}
	items, err := array(path, v)
	if err != nil {
		return s, err
	}
	if len(items) == 0 {
		return s, errorf(path, "must hold at least one status (absent: every response is charged)")
	}
	seen := make(map[string]int)
	for i, e := range items {
		p := jsonfield.Elem(path, i)
		st, err := str(p, e)
		if err != nil {
			return s, err
		}
		class, code, err := parseStatus(st)
		if err != nil {
			return s, &Error{Path: p, Err: err}
		}
		if j, dup := seen[st]; dup {
			return s, errorf(p, strconv.Quote(st)+" repeats "+jsonfield.Elem(path, j))
		}
		seen[st] = i
		if class > 0 {
			s.Classes |= 1 << class
		} else {
			s.Codes = append(s.Codes, code)
		}
	}
	for i, e := range items {
		if _, code, _ := parseStatus(e.String()); code > 0 && s.Classes&(1<<(code/100)) != 0 {
			return s, errorf(jsonfield.Elem(path, i), strconv.Quote(e.String())+" is already in "+strconv.Quote(strconv.Itoa(code/100)+"xx"))
		}
	}
	return s, nil
}

// forbiddenResponseHeaders are headers a rule may not add to its rejection:
// the length is Envoy's business, and the rest are connection-specific
// headers that HTTP/2 and HTTP/3 forbid.
var forbiddenResponseHeaders = []string{"content-length", "transfer-encoding", "connection",
	"keep-alive", "proxy-connection", "upgrade"}

func parseResponseHeaders(path string, v gjson.Result) ([]HeaderPair, error) {
	ms, err := members(path, v)
	if err != nil {
		return nil, err
	}
	var hs []HeaderPair
	seen := make(map[string]bool)
	for _, m := range ms {
		p := jsonlimit.Join(path, m.key)
		if err := checkHeaderName(m.key); err != nil {
			return nil, &Error{Path: p, Err: err}
		}
		name := strings.ToLower(m.key)
		if slices.Contains(forbiddenResponseHeaders, name) {
			return nil, errorf(p, name+" cannot be set by a rule")
		}
		if seen[name] {
			return nil, errorf(p, "header "+name+" is already set")
		}
		seen[name] = true
		value, err := str(p, m.value)
		if err != nil {
			return nil, err
		}
		for i := 0; i < len(value); i++ {
			if c := value[i]; (c < 0x20 && c != '\t') || c == 0x7f {
				return nil, errorf(p, "value must not hold control characters")
			}
		}
		hs = append(hs, HeaderPair{Name: name, Value: value})
	}
	return hs, nil
}

func parseService(path string, v gjson.Result) (*Service, error) {
	o, err := fields(path, v, "cluster", "authority", "path", "lease_path", "charge_path", "timeout_ms", "failure_mode", "token", "key_secret")
	if err != nil {
		return nil, err
	}
	s := &Service{Path: DefaultServicePath, LeasePath: DefaultLeasePath, ChargePath: DefaultChargePath, TimeoutMS: DefaultTimeoutMS}
	if _, ok := o.get("cluster"); !ok {
		return nil, errorf(path+".cluster", "required")
	}
	if s.Cluster, err = o.text("cluster", ""); err != nil {
		return nil, err
	}
	if strings.ContainsRune(s.Cluster, ' ') {
		return nil, errorf(path+".cluster", "must not contain spaces")
	}
	if s.Authority, err = o.text("authority", s.Cluster); err != nil {
		return nil, err
	}
	if strings.ContainsRune(s.Authority, ' ') {
		return nil, errorf(path+".authority", "must not contain spaces")
	}
	if s.Path, err = o.text("path", s.Path); err != nil {
		return nil, err
	}
	if s.LeasePath, err = o.text("lease_path", s.LeasePath); err != nil {
		return nil, err
	}
	if s.ChargePath, err = o.text("charge_path", s.ChargePath); err != nil {
		return nil, err
	}
	for _, f := range [...]struct{ name, p string }{{"path", s.Path}, {"lease_path", s.LeasePath}, {"charge_path", s.ChargePath}} {
		if !strings.HasPrefix(f.p, "/") || strings.ContainsRune(f.p, ' ') {
			return nil, errorf(path+"."+f.name, "must start with / and contain no spaces, got "+strconv.Quote(f.p))
		}
	}
	if s.TimeoutMS, err = o.integer("timeout_ms", DefaultTimeoutMS, 1, MaxTimeoutMS); err != nil {
		return nil, err
	}
	fm, err := o.enum("failure_mode", failureModeNames, int(FailAllow))
	if err != nil {
		return nil, err
	}
	s.FailureMode = FailureMode(fm)
	if s.Token, err = o.text("token", ""); err != nil {
		return nil, err
	}
	if strings.ContainsRune(s.Token, ' ') {
		return nil, errorf(path+".token", "must not contain spaces")
	}
	if s.KeySecret, err = o.text("key_secret", ""); err != nil {
		return nil, err
	}
	if s.KeySecret != "" && len(s.KeySecret) < MinKeySecretBytes {
		return nil, errorf(path+".key_secret", "must hold at least "+strconv.Itoa(MinKeySecretBytes)+" bytes, got "+strconv.Itoa(len(s.KeySecret)))
	}
	return s, nil
}

// object is a JSON object whose field names were checked against a list.
type object struct {
	path   string
	fields map[string]gjson.Result
	order  []string // field names in document order
}

type member struct {
	key   string
	value gjson.Result
}

// members returns the fields of the object v in document order, rejecting
// a name that appears twice.
func members(path string, v gjson.Result) ([]member, error) {
	var ms []member
	seen := make(map[string]bool)
	err := jsonfield.Members(path, v, func(name, at string, val gjson.Result) *jsonfield.Error {
		if seen[name] {
			return jsonfield.Refuse(at, "duplicate field")
		}
		seen[name] = true
		ms = append(ms, member{key: name, value: val})
		return nil
	})
	return ms, fieldError(err)
}

// fields returns the object v, rejecting unknown and duplicate fields.
func fields(path string, v gjson.Result, known ...string) (object, error) {
	ms, err := members(path, v)
	if err != nil {
		return object{}, err
	}
	o := object{path: path, fields: make(map[string]gjson.Result, len(ms))}
	for _, m := range ms {
		if !slices.Contains(known, m.key) {
			return object{}, errorf(jsonlimit.Join(path, m.key), "unknown field")
		}
		o.fields[m.key] = m.value
		o.order = append(o.order, m.key)
	}
	return o, nil
}

func (o object) get(name string) (gjson.Result, bool) {
	v, ok := o.fields[name]
	return v, ok
}

// optString returns the string field name, or nil when it is absent. Unlike
// text, any string is accepted, the empty one included.
func (o object) optString(name string) (*string, error) {
	v, ok := o.get(name)
	if !ok {
		return nil, nil
	}
	s, err := str(jsonlimit.Join(o.path, name), v)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// text returns the string field name, def when absent; a present value must
// be non-empty and free of control characters.
func (o object) text(name, def string) (string, error) {
	v, ok := o.get(name)
	if !ok {
		return def, nil
	}
	p := jsonlimit.Join(o.path, name)
	s, err := str(p, v)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", errorf(p, "must not be empty")
	}
	if hasControl(s) {
		return "", errorf(p, "must not hold control characters")
	}
	return s, nil
}

func (o object) boolean(name string, def bool) (bool, error) {
	v, ok := o.get(name)
	if !ok {
		return def, nil
	}
	return boolean(jsonlimit.Join(o.path, name), v)
}

// enum returns the index in names of the string field name, def when
// absent.
func (o object) enum(name string, names []string, def int) (int, error) {
	v, ok := o.get(name)
	if !ok {
		return def, nil
	}
	p := jsonlimit.Join(o.path, name)
	s, err := str(p, v)
	if err != nil {
		return 0, err
	}
	if i := slices.Index(names, s); i >= 0 {
		return i, nil
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = strconv.Quote(n)
	}
	return 0, errorf(p, "must be one of "+strings.Join(quoted, ", ")+", got "+strconv.Quote(s))
}

// integer returns the integer field name, def when absent; a present value
// must be a whole number in [lo, hi] (1.0 and 1e2 are whole numbers).
func (o object) integer(name string, def, lo, hi int) (int, error) {
	v, ok := o.get(name)
	if !ok {
		return def, nil
	}
	p := jsonlimit.Join(o.path, name)
	if v.Type != gjson.Number {
		return 0, typeError(p, "an integer", v)
	}
	if !integral(v.Raw) {
		return 0, errorf(p, "must be an integer, got "+shorten(v.Raw))
	}
	f, err := strconv.ParseFloat(v.Raw, 64)
	if err != nil || f < float64(lo) || f > float64(hi) {
		return 0, errorf(p, "must be between "+strconv.Itoa(lo)+" and "+strconv.Itoa(hi)+", got "+shorten(v.Raw))
	}
	return int(f), nil
}

// positive returns the number field name, which must be present, > 0 and
// <= hi.
func (o object) positive(name string, hi float64) (float64, error) {
	v, _ := o.get(name)
	p := jsonlimit.Join(o.path, name)
	if v.Type != gjson.Number {
		return 0, typeError(p, "a number", v)
	}
	f, err := strconv.ParseFloat(v.Raw, 64)
	switch {
	case f <= 0: // also -Inf from a huge negative number
		return 0, errorf(p, "must be > 0, got "+shorten(v.Raw))
	case err != nil || f > hi:
		return 0, errorf(p, "must be at most "+fmtFloat(hi)+", got "+shorten(v.Raw))
	}
	return f, nil
}

func str(path string, v gjson.Result) (string, error) {
	s, err := jsonfield.String(path, v)
	return s, fieldError(err)
}

func boolean(path string, v gjson.Result) (bool, error) {
	b, err := jsonfield.Bool(path, v)
	return b, fieldError(err)
}

// array returns the elements of the array v.
func array(path string, v gjson.Result) ([]gjson.Result, error) {
	a, err := jsonfield.Array(path, v)
	return a, fieldError(err)
}

func typeError(path, want string, v gjson.Result) error {
	return fieldError(jsonfield.TypeError(path, want, v))
}

// integral reports whether the JSON number raw is a whole number, exactly
// (not after rounding to float64): 10, 1.0, 1e2 and 1500e-2 are; 1.5 is not.
func integral(raw string) bool {
	s := strings.TrimPrefix(raw, "-")
	mant, exp := s, 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant = s[:i]
		e, err := strconv.Atoi(s[i+1:])
		switch {
		case err == nil:
			exp = max(min(e, 1<<30), -1<<30)
		case strings.HasPrefix(s[i+1:], "-"):
			exp = -1 << 30
		default:
			exp = 1 << 30
		}
	}
	whole, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(whole+frac, "0")
	if digits == "" {
		return true // zero
	}
	trimmed := strings.TrimRight(digits, "0")
	// The value is trimmed × 10^(exp − len(frac) + trailing zeros).
	return exp-len(frac)+len(digits)-len(trimmed) >= 0
}

// shorten keeps a number's text short enough for an error message.
func shorten(raw string) string {
	if len(raw) > 40 {
		return raw[:37] + "..."
	}
	return raw
}

// fmtFloat formats f as briefly as it round-trips, in positional notation
// unless that would be long (as JavaScript prints numbers).
func fmtFloat(f float64) string { return string(appendFloat(nil, f)) }

func appendFloat(b []byte, f float64) []byte {
	if a := math.Abs(f); a == 0 || (a >= 1e-6 && a < 1e21) {
		return strconv.AppendFloat(b, f, 'f', -1, 64)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}
