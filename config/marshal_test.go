package config

import (
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MarshalJSON returns the configuration as canonical JSON: compact, fields in
// a fixed order, every default written out and inherited top-level values
// (mode, scope, service) resolved into the rules, tokens_per_second rather
// than rps, header names lower-cased. For a Config returned by Parse, Parse
// accepts the result and returns an equal Config, and marshalling that again
// gives the same bytes. The output holds service tokens as they were given:
// treat it as a secret when a token is set.
func (c *Config) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 256)
	b = append(b, `{"rules":[`...)
	for i := range c.Rules {
		if i > 0 {
			b = append(b, ',')
		}
		b = c.appendRule(b, &c.Rules[i])
	}
	b = append(b, `],"xff_num_trusted_hops":`...)
	b = strconv.AppendInt(b, int64(c.XFFNumTrustedHops), 10)
	b = append(b, `,"trust_unverified_jwt":`...)
	b = strconv.AppendBool(b, c.TrustUnverifiedJWT)
	b = appendField(b, "jwt_metadata_namespace", c.JWTMetadataNamespace)
	b = appendField(b, "jwt_payload_key", c.JWTPayloadKey)
	b = appendField(b, "headers", c.Headers.String())
	b = append(b, `,"max_keys":`...)
	b = strconv.AppendInt(b, int64(c.MaxKeys), 10)
	if c.Service != nil {
		b = append(b, `,"service":`...)
		b = appendService(b, c.Service)
	}
	return append(b, '}'), nil
}

func (c *Config) appendRule(b []byte, r *Rule) []byte {
	b = append(b, `{"name":`...)
	b = appendString(b, r.Name)
	b = appendField(b, "action", r.Action.String())
	if r.Action == ActionAllow {
		b = appendGroupMatch(b, r)
		return append(b, '}')
	}
	b = appendField(b, "mode", r.Mode.String())
	b = appendGroupMatch(b, r)
	b = append(b, `,"limit_keys":[`...)
	for i, k := range r.LimitKeys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k.String())
	}
	b = append(b, ']')
	b = appendField(b, "missing_key", r.MissingKey.String())
	unit := 1.0 // a price table's rule counts millionths: written in units
	if r.Cost.Money != nil {
		unit = MicroUnits
	}
	switch cal := r.Limit.Calendar; {
	case r.Algorithm == AlgorithmConcurrency:
		b = append(b, `,"algorithm":"concurrency","algorithm_config":{"max_in_flight":`...)
		b = strconv.AppendInt(b, int64(r.Concurrency.MaxInFlight), 10)
		if r.Limit.MaxDelayMS > 0 {
			b = append(b, `,"max_delay_ms":`...)
			b = strconv.AppendInt(b, int64(r.Limit.MaxDelayMS), 10)
			b = append(b, `,"max_waiting":`...)
			b = strconv.AppendInt(b, int64(r.Limit.MaxWaiting), 10)
		}
		if r.Scope == ScopeCluster {
			b = append(b, `,"ttl_ms":`...)
			b = strconv.AppendInt(b, int64(r.Concurrency.TTLMS), 10)
		}
		b = append(b, '}')
		return appendReply(b, c, r)
	case r.Limit.Quota():
		b = append(b, `,"algorithm":"quota","algorithm_config":{"limit":`...)
		b = appendFloat(b, r.Limit.Burst/unit)
		b = appendField(b, "period", cal.Period.String())
		b = appendField(b, "time_zone", cal.Location.String())
		b = appendField(b, "week_start", strings.ToLower(cal.WeekStart.String()))
		if !cal.Anchor.IsZero() {
			b = appendField(b, "anchor", cal.Anchor.String())
		}
	default:
		b = append(b, `,"algorithm":"token_bucket","algorithm_config":{"tokens_per_second":`...)
		b = appendFloat(b, r.Limit.TokensPerSecond/unit)
		b = append(b, `,"burst":`...)
		b = appendFloat(b, r.Limit.Burst/unit)
	}
	if m := r.Cost.Money; m != nil {
		b = appendMoney(b, m)
	} else {
		b = appendField(b, "cost_source", r.Cost.Source.String())
		b = append(b, `,"fixed_cost":`...)
		b = appendFloat(b, r.Cost.Fixed)
	}
	b = append(b, `,"default_cost":`...)
	b = appendFloat(b, r.Cost.Default/unit)
	if r.Cost.Truncated > 0 && r.Cost.Money == nil {
		b = append(b, `,"truncated_cost":`...)
		b = appendFloat(b, r.Cost.Truncated)
	}
	if r.Cost.MaxBodyBytes > 0 {
		b = append(b, `,"max_body_bytes":`...)
		b = strconv.AppendInt(b, int64(r.Cost.MaxBodyBytes), 10)
	}
	if r.Limit.MaxDelayMS > 0 {
		b = append(b, `,"max_delay_ms":`...)
		b = strconv.AppendInt(b, int64(r.Limit.MaxDelayMS), 10)
		b = append(b, `,"max_waiting":`...)
		b = strconv.AppendInt(b, int64(r.Limit.MaxWaiting), 10)
	}
	b = append(b, '}')
	if r.ChargeOn.Listed {
		b = append(b, `,"charge_on":[`...)
		n := len(b)
		for c := 1; c <= 5; c++ {
			if r.ChargeOn.Classes&(1<<c) != 0 {
				b = appendSep(b, n)
				b = appendString(b, strconv.Itoa(c)+"xx")
			}
		}
		for _, code := range r.ChargeOn.Codes {
			b = appendSep(b, n)
			b = appendString(b, strconv.Itoa(code))
		}
		b = append(b, ']')
	}
	return appendReply(b, c, r)
}

// appendReply appends a limit rule's fields from status on.
func appendReply(b []byte, c *Config, r *Rule) []byte {
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = appendField(b, "body", r.Body)
	if len(r.ResponseHeaders) > 0 {
		b = append(b, `,"response_headers":{`...)
		for i, h := range r.ResponseHeaders {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, h.Name)
			b = append(b, ':')
			b = appendString(b, h.Value)
		}
		b = append(b, '}')
	}
	b = appendField(b, "scope", r.Scope.String())
	// A rule that uses the top-level service (the same pointer) inherits it
	// again when parsed; only a rule's own service is written.
	if r.Service != nil && r.Service != c.Service {
		b = append(b, `,"service":`...)
		b = appendService(b, r.Service)
	}
	if r.Sync == SyncLease {
		b = appendField(b, "sync", r.Sync.String())
		b = append(b, `,"lease":{"ttl_ms":`...)
		b = strconv.AppendInt(b, int64(r.Lease.TTLMS), 10)
		b = append(b, `,"max_share":`...)
		b = appendFloat(b, r.Lease.MaxShare)
		b = append(b, '}')
	}
	return append(b, '}')
}

func appendGroupMatch(b []byte, r *Rule) []byte {
	if r.Group != "" {
		b = appendField(b, "group", r.Group)
	}
	if len(r.Match) == 0 {
		return b
	}
	b = append(b, `,"match":{`...)
	for i, m := range r.Match {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, m.Source.String())
		b = append(b, ":{"...)
		n := len(b)
		if m.Present != nil {
			b = append(b, `"present":`...)
			b = strconv.AppendBool(b, *m.Present)
		}
		if m.Equals != nil {
			b = appendSep(b, n)
			b = append(b, `"equals":`...)
			b = appendString(b, *m.Equals)
		}
		if m.In != nil {
			b = appendSep(b, n)
			b = append(b, `"in":[`...)
			for j, s := range m.In {
				if j > 0 {
					b = append(b, ',')
				}
				b = appendString(b, s)
			}
			b = append(b, ']')
		}
		if m.Prefix != nil {
			b = appendSep(b, n)
			b = append(b, `"prefix":`...)
			b = appendString(b, *m.Prefix)
		}
		if m.Regex != nil {
			b = appendSep(b, n)
			b = append(b, `"regex":`...)
			b = appendString(b, m.Regex.String())
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// appendSep appends a comma unless b has not grown past n.
func appendSep(b []byte, n int) []byte {
	if len(b) > n {
		b = append(b, ',')
	}
	return b
}

func appendService(b []byte, s *Service) []byte {
	b = append(b, `{"cluster":`...)
	b = appendString(b, s.Cluster)
	b = appendField(b, "authority", s.Authority)
	b = appendField(b, "path", s.Path)
	b = appendField(b, "lease_path", s.LeasePath)
	b = appendField(b, "charge_path", s.ChargePath)
	b = append(b, `,"timeout_ms":`...)
	b = strconv.AppendInt(b, int64(s.TimeoutMS), 10)
	b = append(b, `,"lease_timeout_ms":`...)
	b = strconv.AppendInt(b, int64(s.LeaseTimeoutMS), 10)
	b = appendField(b, "failure_mode", s.FailureMode.String())
	if s.Token != "" {
		b = appendField(b, "token", s.Token)
	}
	return append(b, '}')
}

// appendField appends ,"name":"value".
func appendField(b []byte, name, value string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return appendString(b, value)
}

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD, as
// encoding/json does; Parse never yields such strings.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// appendMoney writes a price table: every row with every price name in
// Names' order (so Parse finds the same order), the models sorted, "*"
// last.
func appendMoney(b []byte, m *Money) []byte {
	b = append(b, `,"prices":{"model":`...)
	b = appendString(b, m.Model.String())
	b = append(b, `,"per":`...)
	b = strconv.AppendUint(b, m.Per, 10)
	b = append(b, `,"table":{`...)
	models := make([]string, 0, len(m.Table))
	for k := range m.Table {
		models = append(models, k)
	}
	sort.Strings(models)
	row := func(b []byte, name string, prices []uint64) []byte {
		if b[len(b)-1] != '{' {
			b = append(b, ',')
		}
		b = appendString(b, name)
		b = append(b, ":{"...)
		for i, n := range m.Names {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, n)
			b = append(b, ':')
			b = appendFloat(b, float64(prices[i])/MicroUnits)
		}
		return append(b, '}')
	}
	for _, k := range models {
		b = row(b, k, m.Table[k])
	}
	if m.Default != nil {
		b = row(b, "*", m.Default)
	}
	b = append(b, `}},"cost_terms":[`...)
	for i, t := range m.Terms {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"source":`...)
		b = appendString(b, t.Source.String())
		b = append(b, `,"price":`...)
		b = appendString(b, m.Names[t.Price])
		b = append(b, '}')
	}
	b = append(b, ']')
	if m.Reserve.Set {
		b = append(b, `,"reserve":{"source":`...)
		b = appendString(b, m.Reserve.Source.String())
		b = append(b, `,"price":`...)
		b = appendString(b, m.Names[m.Reserve.Price])
		b = append(b, '}')
	}
	return b
}
