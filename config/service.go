package config

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

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
			if secrets := secretName(field); secrets != "" {
				return errorf(this+".service."+field, msg+at+" and "+this+" have different "+secrets)
			}
			return errorf(this+".service."+field, msg+at+" has "+a+", "+this+" has "+b)
		}
	}
	return nil
}

// serviceFields are the fields of Service by their JSON names, each with
// its value as the configuration spells it (TestServiceDiffNamesEveryField
// fails when a field of Service is missing here). A field whose values are
// secrets names them (secrets, plural): an error says that they differ,
// never what they are.
var serviceFields = [...]struct {
	name    string
	value   func(*Service) string
	secrets string
}{
	{"cluster", func(s *Service) string { return strconv.Quote(s.Cluster) }, ""},
	{"authority", func(s *Service) string { return strconv.Quote(s.Authority) }, ""},
	{"path", func(s *Service) string { return strconv.Quote(s.Path) }, ""},
	{"lease_path", func(s *Service) string { return strconv.Quote(s.LeasePath) }, ""},
	{"charge_path", func(s *Service) string { return strconv.Quote(s.ChargePath) }, ""},
	{"timeout_ms", func(s *Service) string { return strconv.Itoa(s.TimeoutMS) }, ""},
	{"lease_timeout_ms", func(s *Service) string { return strconv.Itoa(s.LeaseTimeoutMS) }, ""},
	{"failure_mode", func(s *Service) string { return strconv.Quote(failureModeNames[s.FailureMode]) }, ""},
	{"token", func(s *Service) string { return strconv.Quote(s.Token) }, "tokens"},
	{"key_secret", func(s *Service) string { return strconv.Quote(s.KeySecret) }, "key secrets"},
}

// secretName is what the values of the service field named field are
// called when they are secrets, "" when they may be printed.
func secretName(field string) string {
	for _, f := range serviceFields {
		if f.name == field {
			return f.secrets
		}
	}
	return ""
}

// serviceDiff returns the JSON name of the first field in which a and b
// differ, with its two values ("" when they are equal). Callers must not
// print the values of a field with secrets (secretName).
func serviceDiff(a, b *Service) (field, av, bv string) {
	for _, f := range serviceFields {
		if x, y := f.value(a), f.value(b); x != y {
			return f.name, x, y
		}
	}
	return "", "", ""
}

func parseService(path string, v gjson.Result) (*Service, error) {
	o, err := fields(path, v, "cluster", "authority", "path", "lease_path", "charge_path", "timeout_ms", "lease_timeout_ms", "failure_mode", "token", "key_secret")
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
	if s.LeaseTimeoutMS, err = o.integer("lease_timeout_ms", max(DefaultLeaseTimeoutMS, s.TimeoutMS), 1, MaxTimeoutMS); err != nil {
		return nil, err
	}
	if s.LeaseTimeoutMS < s.TimeoutMS {
		return nil, errorf(path+".lease_timeout_ms", "must be >= timeout_ms ("+strconv.Itoa(s.TimeoutMS)+"), got "+strconv.Itoa(s.LeaseTimeoutMS))
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
