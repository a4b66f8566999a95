package plugin

import (
	"encoding/base64"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/config"
)

// headers is how a request's values are read from the host; tests can
// substitute it.
type headers interface {
	header(name string) (string, bool)
	property(path ...string) ([]byte, bool)
}

// request reads the values a request offers to limit keys, match conditions
// and costs, each at most once from the host.
type request struct {
	h   headers
	cfg *config.Config

	pathDone, ipDone bool
	rawPath, ip      string
	ipOK             bool
}

// value returns the value of src for this request and whether it has one.
func (r *request) value(src config.Source) (string, bool) {
	switch src.Kind {
	case config.SourceHeader:
		return r.h.header(src.Name)
	case config.SourceMethod:
		return r.h.header(":method")
	case config.SourceAuthority:
		return r.h.header(":authority")
	case config.SourcePath:
		p := r.path()
		if i := strings.IndexByte(p, '?'); i >= 0 {
			p = p[:i]
		}
		return p, p != ""
	case config.SourceQuery:
		return queryParam(r.path(), src.Name)
	case config.SourceCookie:
		c, ok := r.h.header("cookie")
		if !ok {
			return "", false
		}
		return cookieValue(c, src.Name)
	case config.SourceIP:
		return r.clientIP()
	case config.SourceJWT:
		return r.jwtClaim(src.Name)
	}
	return "", false
}

func (r *request) path() string {
	if !r.pathDone {
		r.pathDone = true
		r.rawPath, _ = r.h.header(":path")
	}
	return r.rawPath
}

// clientIP is the downstream address Envoy reports (source.address), or
// with xff_num_trusted_hops N > 0 the address Envoy's own
// xff_num_trusted_hops N would trust: the Nth from the right of
// X-Forwarded-For as the client's proxies sent it. An edge Envoy
// (use_remote_address: true, which ip:address requires: see the README)
// appends the peer's address to the header before any filter runs, so that
// entry is skipped: the plugin counts N+1 from the right. With fewer
// addresses than that it falls back to the downstream address.
func (r *request) clientIP() (string, bool) {
	if r.ipDone {
		return r.ip, r.ipOK
	}
	r.ipDone = true
	if n := r.cfg.XFFNumTrustedHops; n > 0 {
		if xff, ok := r.h.header("x-forwarded-for"); ok {
			if ip, ok := xffClient(xff, n+1); ok {
				r.ip, r.ipOK = ip, true
				return r.ip, true
			}
		}
	}
	if a, ok := r.h.property("source", "address"); ok {
		r.ip, r.ipOK = stripPort(string(a)), len(a) > 0
	}
	return r.ip, r.ipOK
}

// jwtClaim reads a claim (dots for nesting) of the token jwt_authn verified,
// from the metadata it writes with payload_in_metadata; or, only with
// trust_unverified_jwt, from the bearer token's payload.
func (r *request) jwtClaim(claim string) (string, bool) {
	path := []string{"metadata", "filter_metadata", r.cfg.JWTMetadataNamespace, r.cfg.JWTPayloadKey}
	path = append(path, strings.Split(claim, ".")...)
	if v, ok := r.h.property(path...); ok && len(v) > 0 {
		return string(v), true
	}
	if !r.cfg.TrustUnverifiedJWT {
		return "", false
	}
	auth, ok := r.h.header("authorization")
	if !ok {
		return "", false
	}
	return unverifiedClaim(auth, claim)
}

// xffClient returns the nth address from the right of an X-Forwarded-For
// value (n >= 1).
func xffClient(xff string, n int) (string, bool) {
	for i := 1; ; i++ {
		j := strings.LastIndexByte(xff, ',')
		part := strings.TrimSpace(xff[j+1:])
		if i == n {
			return part, part != ""
		}
		if j < 0 {
			return "", false
		}
		xff = xff[:j]
	}
}

// stripPort turns "1.2.3.4:5678" or "[::1]:5678" into the address alone.
func stripPort(a string) string {
	if strings.HasPrefix(a, "[") {
		if i := strings.IndexByte(a, ']'); i > 0 {
			return a[1:i]
		}
		return a
	}
	if i := strings.LastIndexByte(a, ':'); i >= 0 && strings.IndexByte(a, ':') == i {
		return a[:i]
	}
	return a
}

// queryParam returns the first value of name in the query of path,
// percent-decoded. A malformed escape makes the value absent.
func queryParam(path, name string) (string, bool) {
	i := strings.IndexByte(path, '?')
	if i < 0 {
		return "", false
	}
	q := path[i+1:]
	if j := strings.IndexByte(q, '#'); j >= 0 {
		q = q[:j]
	}
	for q != "" {
		var pair string
		pair, q, _ = strings.Cut(q, "&")
		k, v, _ := strings.Cut(pair, "=")
		if k != name {
			if !strings.ContainsAny(k, "%+") {
				continue
			}
			if uk, ok := unescape(k); !ok || uk != name {
				continue
			}
		}
		return unescape(v)
	}
	return "", false
}

// unescape decodes a query component: "+" is a space, "%XX" a byte. A
// malformed escape makes ok false.
func unescape(s string) (string, bool) {
	if !strings.ContainsAny(s, "%+") {
		return s, true
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '+':
			b = append(b, ' ')
		case '%':
			if i+2 >= len(s) || unhex(s[i+1]) < 0 || unhex(s[i+2]) < 0 {
				return "", false
			}
			b = append(b, byte(unhex(s[i+1])<<4|unhex(s[i+2])))
			i += 2
		default:
			b = append(b, c)
		}
	}
	return string(b), true
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}

// cookieValue returns the value of the named cookie in a Cookie header.
func cookieValue(header, name string) (string, bool) {
	for header != "" {
		var part string
		part, header, _ = strings.Cut(header, ";")
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if ok && k == name {
			return strings.Trim(v, `"`), true
		}
	}
	return "", false
}

// unverifiedClaim reads a claim from the payload of "Bearer <jwt>" without
// verifying anything.
func unverifiedClaim(auth, claim string) (string, bool) {
	tok, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		return "", false
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "", false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil || !gjson.ValidBytes(payload) {
		return "", false
	}
	v := gjson.GetBytes(payload, escapeClaimPath(claim))
	if !v.Exists() {
		return "", false
	}
	if v.Type == gjson.String {
		return v.Str, true
	}
	return v.Raw, true
}

// escapeClaimPath escapes gjson's wildcard and modifier characters so a
// claim path is only ever a plain dotted path.
func escapeClaimPath(p string) string {
	if !strings.ContainsAny(p, `*?|#@\!`) {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if strings.IndexByte(`*?|#@\!`, p[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

// matches reports whether every condition holds for the request.
func (r *request) matches(conds []config.Condition) bool {
	for i := range conds {
		c := &conds[i]
		v, ok := r.value(c.Source)
		if c.Present != nil && *c.Present != ok {
			return false
		}
		if c.Equals == nil && c.In == nil && c.Prefix == nil && c.Regex == nil {
			continue
		}
		if !ok {
			return false
		}
		if c.Equals != nil && v != *c.Equals {
			return false
		}
		if c.Prefix != nil && !strings.HasPrefix(v, *c.Prefix) {
			return false
		}
		if c.In != nil && !contains(c.In, v) {
			return false
		}
		if c.Regex != nil && !c.Regex.MatchString(v) {
			return false
		}
	}
	return true
}

func contains(list []string, v string) bool {
	for _, s := range list {
		if s == v {
			return true
		}
	}
	return false
}
