package service

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Callers are who may call limitd, and how each is recognised: a bearer
// token names its caller, except a front proxy's, whose calls are those of
// the identity it forwards in the identity header (exactly one value, one
// of the Identities, compared exactly). Every door authenticates through
// the same Callers (the HTTP API from its headers, the gRPC door from its
// metadata, the header's name lower-cased), so a caller is the same caller
// on each, and an identity removed from the token file reaches none. A
// Callers is immutable and safe for concurrent use.
type Callers struct {
	names  []string     // tokens' callers, then identities'
	proxy  []bool       // proxy[i]: token i is a front proxy's
	bearer BearerTokens // token i's value is bearer's i-th
	ids    map[string]int
	header string // canonical (HTTP) form; "" without a front proxy
}

// NewCallers validates tokens and identities (names distinct and valid
// callers, CheckCaller; values set; identities only with a front proxy's
// token, and then an identity header) and returns them as Callers. No
// token: Open, every call is DefaultCaller's.
func NewCallers(tokens []Token, identities []Identity, identityHeader string) (*Callers, error) {
	c := &Callers{}
	seen := map[string]bool{}
	proxies := 0
	for i, t := range tokens {
		switch {
		case t.Name == "" || t.Value == "":
			return nil, fmt.Errorf("service: config: tokens[%d]: name and value are required", i)
		case seen[t.Name]:
			return nil, fmt.Errorf("service: config: tokens[%d].name: %q named twice", i, t.Name)
		}
		if err := CheckCaller(t.Name); err != nil {
			return nil, fmt.Errorf("service: config: tokens[%d].name: %w", i, err)
		}
		seen[t.Name] = true
		if t.FrontProxy {
			proxies++
		}
		c.bearer.Add(t.Value)
		c.names = append(c.names, t.Name)
		c.proxy = append(c.proxy, t.FrontProxy)
	}
	switch {
	case proxies > 0 && identityHeader == "":
		return nil, errors.New("service: config: identity header: required with a front proxy's token")
	case len(identities) > 0 && proxies == 0:
		return nil, errors.New("service: config: identities: need a front proxy's token to arrive by")
	}
	if proxies > 0 {
		c.header = http.CanonicalHeaderKey(identityHeader)
	}
	for i, id := range identities {
		switch {
		case id.Value == "":
			return nil, fmt.Errorf("service: config: identities[%d].value: required", i)
		case seen[id.Name]:
			return nil, fmt.Errorf("service: config: identities[%d].name: %q named twice", i, id.Name)
		}
		if err := CheckCaller(id.Name); err != nil {
			return nil, fmt.Errorf("service: config: identities[%d].name: %w", i, err)
		}
		if _, dup := c.ids[id.Value]; dup {
			return nil, fmt.Errorf("service: config: identities[%d].value: %q listed twice", i, id.Value)
		}
		seen[id.Name] = true
		if c.ids == nil {
			c.ids = map[string]int{}
		}
		c.ids[id.Value] = len(c.names)
		c.names = append(c.names, id.Name)
	}
	return c, nil
}

// Open reports whether no token is needed.
func (c *Callers) Open() bool { return c.bearer.Len() == 0 }

// Names are the callers' names; Authenticate returns an index into them.
// Do not modify the slice.
func (c *Callers) Names() []string { return c.names }

// IdentityHeader is the identity header in its canonical HTTP form ("" with
// no front proxy's token); in gRPC metadata it is lower-cased.
func (c *Callers) IdentityHeader() string { return c.header }

// Authenticate returns the index (in Names) of the caller of a call that
// carries authorization (its one Authorization value, "Bearer <token>")
// and identity (the values of the identity header, read only for a front
// proxy's token), or -1 and why the call is refused. Every token is
// compared, so the time taken does not say which one matched. With no
// token (Open) it returns -1 and "": the caller is DefaultCaller.
func (c *Callers) Authenticate(authorization string, identity []string) (int, string) {
	if c.Open() {
		return -1, ""
	}
	i := c.bearer.Match(authorization)
	if i < 0 {
		return -1, "authorization: missing or wrong bearer token"
	}
	if !c.proxy[i] {
		return i, ""
	}
	if len(identity) == 1 {
		if j, ok := c.ids[identity[0]]; ok {
			return j, ""
		}
	}
	return -1, "authorization: front proxy " + strconv.Quote(c.names[i]) + ": " + c.header + " names no known caller"
}

// CallerFrom returns the caller WithCaller set on ctx, if any (a door's
// authentication did).
func CallerFrom(ctx context.Context) (string, bool) {
	c, ok := ctx.Value(callerKey{}).(string)
	return c, ok
}
