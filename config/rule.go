package config

import (
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

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
				return r, errorf(o.at(name), "not allowed with action \"allow\" (an allow rule takes only name, action, group and match)")
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
	parseConfig := parseAlgorithmConfig
	switch algorithm {
	case "token_bucket":
	case "quota":
		parseConfig = parseQuota
	default:
		return r, errorf(path+".algorithm", "must be \"token_bucket\" or \"quota\", got "+strconv.Quote(algorithm))
	}
	cv, ok := o.get("algorithm_config")
	if !ok {
		return r, errorf(path+".algorithm_config", "required for action \"limit\"")
	}
	if r.Limit, r.Cost, err = parseConfig(path+".algorithm_config", cv); err != nil {
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
	case r.Sync == SyncLease && r.Limit.Burst < r.Limit.TokensPerSecond && r.Limit.MaxDelayMS == 0:
		return errorf(path+".algorithm_config.burst", "must be >= tokens_per_second ("+fmtFloat(r.Limit.TokensPerSecond)+") for sync \"lease\" (the lease call's bound), got "+fmtFloat(r.Limit.Burst))
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
	burst := ".burst"
	if l.Quota() {
		burst = ".limit"
	}
	if l.Burst > wire.MaxAmount {
		return errorf(path+burst, "must be at most "+fmtFloat(wire.MaxAmount)+" for a cluster rule (the limit service's bound), got "+fmtFloat(l.Burst))
	}
	if fill := l.Burst / l.TokensPerSecond; !l.Quota() && fill > wire.MaxFill.Seconds() {
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
		p := m.at
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
