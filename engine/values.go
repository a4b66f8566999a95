package engine

import (
	"encoding/base64"
	"hash"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/internal/jsonlimit"
)

// maxJWTPayload bounds the unverified bearer token payload the plugin
// decodes (base64url text), and maxJWTDepth its nesting, before gjson (whose
// validator recurses once per level) sees it: a client controls both.
const (
	maxJWTPayload = 8 << 10
	maxJWTDepth   = 16
)

// requestValues reads the values a request offers to limit keys, match
// conditions and costs, each at most once from the host: a value read for a
// match condition is the value a limit key then uses. It lives for one
// OnRequestHeaders.
type requestValues struct {
	s      Stream
	cfg    *config.Config
	values []cachedValue
	// cookies are the values of every Cookie header, read once for all
	// cookie sources.
	cookies     []string
	cookiesRead bool
	// body is the request whose body gave the request_json values (nil:
	// none).
	body *Request
}

type cachedValue struct {
	src config.Source
	v   string
	ok  bool
}

// value returns the value of src for this request and whether it has one.
func (r *requestValues) value(src config.Source) (string, bool) {
	for i := range r.values {
		if r.values[i].src == src {
			return r.values[i].v, r.values[i].ok
		}
	}
	v, ok := r.read(src)
	r.values = append(r.values, cachedValue{src, v, ok})
	return v, ok
}

// read reads the value of src from the host.
func (r *requestValues) read(src config.Source) (string, bool) {
	switch src.Kind {
	case config.SourceHeader:
		return r.s.RequestHeader(src.Name)
	case config.SourceMethod:
		return r.s.RequestHeader(":method")
	case config.SourceAuthority:
		return r.s.RequestHeader(":authority")
	case config.SourcePath:
		p := r.rawPath()
		if i := strings.IndexByte(p, '?'); i >= 0 {
			p = p[:i]
		}
		return p, p != ""
	case config.SourceQuery:
		return queryParam(r.rawPath(), src.Name)
	case config.SourceCookie:
		return r.cookie(src.Name)
	case config.SourceIP:
		return r.clientIP()
	case config.SourceJWT:
		return r.jwtClaim(src.Name)
	case config.SourceRequestJSON:
		if r.body != nil {
			return r.body.bodyValue(src)
		}
	}
	return "", false
}

// rawPath is :path, query included (read once, as a source of its own).
func (r *requestValues) rawPath() string {
	v, _ := r.value(config.Source{Kind: config.SourceHeader, Name: ":path"})
	return v
}

// cookie is the first cookie called name over every Cookie header, as Go's
// net/http and most upstreams read them: a client that splits its cookies
// over two headers, or writes "name =v", still names its own bucket. A
// request sends Cookie headers rarely enough that reading all its headers
// for them costs nothing the others pay.
func (r *requestValues) cookie(name string) (string, bool) {
	if !r.cookiesRead {
		r.cookiesRead = true
		if hs := r.s.RequestHeaders(); len(hs) > 0 {
			for _, h := range hs {
				if h[0] == "cookie" {
					r.cookies = append(r.cookies, h[1])
				}
			}
		}
	}
	for _, c := range r.cookies {
		if v, ok := cookieValue(c, name); ok {
			return v, true
		}
	}
	return "", false
}

// clientIP is the downstream address Envoy reports (source.address), or
// with xff_num_trusted_hops N > 0 the address Envoy's own
// xff_num_trusted_hops N would trust: the Nth from the right of
// X-Forwarded-For as the client's proxies sent it. An edge Envoy
// (use_remote_address: true, which ip:address requires: see the README)
// appends the peer's address to the header before any filter runs, so that
// entry is skipped: the plugin counts N+1 from the right. With fewer
// addresses than that it falls back to the downstream address.
func (r *requestValues) clientIP() (string, bool) {
	if n := r.cfg.XFFNumTrustedHops; n > 0 {
		if xff, ok := r.s.RequestHeader("x-forwarded-for"); ok {
			if ip, ok := xffClient(xff, n+1); ok {
				return ip, true
			}
		}
	}
	a, ok := r.s.Property("source", "address")
	return stripPort(string(a)), ok && len(a) > 0
}

// jwtClaim reads a claim (dots for nesting) of the token jwt_authn verified,
// from the metadata it writes with payload_in_metadata; or, only with
// trust_unverified_jwt, from the bearer token's payload.
func (r *requestValues) jwtClaim(claim string) (string, bool) {
	path := []string{"metadata", "filter_metadata", r.cfg.JWTMetadataNamespace, r.cfg.JWTPayloadKey}
	path = append(path, strings.Split(claim, ".")...)
	if v, ok := r.s.Property(path...); ok && len(v) > 0 {
		return string(v), true
	}
	if !r.cfg.TrustUnverifiedJWT {
		return "", false
	}
	auth, ok := r.s.RequestHeader("authorization")
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

// cookieValue returns the value of the first cookie called name in one
// Cookie header value. Names are compared after trimming spaces and tabs
// ("sid =v" is the cookie sid, as net/http reads it); a value loses the
// double quotes around it, and never holds a ';'.
func cookieValue(header, name string) (string, bool) {
	for header != "" {
		var part string
		part, header, _ = strings.Cut(header, ";")
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if ok && strings.TrimRight(k, " \t") == name {
			v = strings.TrimLeft(v, " \t")
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			return v, true
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
	if len(parts) != 3 || len(parts[1]) > maxJWTPayload {
		return "", false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return "", false
	}
	if _, ok := jsonlimit.Check(payload, maxJWTDepth); !ok || !gjson.ValidBytes(payload) {
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

// matches reports whether every condition holds for the request. A regex
// reads at most the condition's RegexMaxInput bytes: a longer value does not
// match, and is counted in long.
func (r *requestValues) matches(conds []config.Condition, long Counter) bool {
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
		if c.Regex != nil {
			if len(v) > c.RegexMaxInput {
				long.Increment(1)
				return false
			}
			if !c.Regex.MatchString(v) {
				return false
			}
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

// identity is the bucket of ru for this request: the keyed hash of the
// rule and its key values (hash.go), and for a cluster rule also the
// bucket's name in the limit service (see clusterKey), all from one read of
// each value. present is false when a key has no value; id and key are
// then the rule's one bucket for all such requests (what missing_key
// "shared" uses).
func identity(ru *rule, r *requestValues) (id uint64, key string, present bool) {
	cluster := ru.Scope == config.ScopeCluster
	var mac hash.Hash // keyed cluster keys: see keyMAC
	if cluster && ru.Service != nil && ru.Service.KeySecret != "" {
		mac = keyMAC(ru)
	}
	own := ru.identity
	lo, hi := ru.clusterName, ru.clusterName.byte(0x5c)
	present = true
	for _, k := range ru.LimitKeys {
		v, has := r.value(k)
		if !has {
			own = ru.identity
			own.byte(0xff)
			lo, hi, present = ru.clusterName.byte(0xff), ru.clusterName.byte(0x5c).byte(0xff), false
			break
		}
		own.field(v)
		switch {
		case mac != nil:
			macField(mac, v)
		case cluster:
			lo, hi = lo.field(v), hi.field(v)
		}
	}
	switch {
	case cluster && mac != nil && present:
		key = keyedClusterKey(ru.Name, mac)
	case cluster:
		key = clusterKey(ru.Name, lo.sum(), hi.sum())
	}
	return own.sum(), key, present
}
