package engine

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
)

// TestUnverifiedClaimBounded: a bearer token's payload over maxJWTPayload
// bytes is not read.
func TestUnverifiedClaimBounded(t *testing.T) {
	big := "Bearer e30." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"`+strings.Repeat("x", maxJWTPayload)+`"}`)) + ".x"
	if v, ok := unverifiedClaim(big, "sub"); ok {
		t.Fatalf("a payload over %d bytes was read: %q", maxJWTPayload, v[:10])
	}
}

// FuzzRequestValues checks properties of the request-value parsers on any
// input: a query value round-trips through percent-encoding; a cookie value
// never holds a ';' and its name matched after trimming; an X-Forwarded-For
// entry never holds a ','; no parser panics.
func FuzzRequestValues(f *testing.F) {
	for _, s := range []string{"/p?a=1&b=%zz", "a=1; b=\"2\"", "1.1.1.1, 2.2.2.2", "Bearer a.eyJzdWIiOiJ4In0.c", "[::1]:80", "b =x;b=y"} {
		f.Add(s, "b", 1)
	}
	f.Fuzz(func(t *testing.T, s, name string, n int) {
		if v, ok := unescape(url.QueryEscape(s)); !ok || v != s {
			t.Fatalf("unescape(QueryEscape(%q)) = %q, %v", s, v, ok)
		}
		if name != "" && !strings.ContainsAny(name, "&=#?%+") {
			if v, ok := queryParam("/p?"+name+"="+url.QueryEscape(s), name); !ok || v != s {
				t.Fatalf("queryParam(%q = %q) = %q, %v", name, s, v, ok)
			}
		}
		if v, ok := cookieValue(s, name); ok && strings.Contains(v, ";") {
			t.Fatalf("cookieValue(%q, %q) = %q: holds a ';'", s, name, v)
		}
		if n > 0 && n < 64 {
			if v, ok := xffClient(s, n); ok && strings.Contains(v, ",") {
				t.Fatalf("xffClient(%q, %d) = %q: holds a ','", s, n, v)
			}
		}
		unverifiedClaim(s, name)
		stripPort(s)
		escapeClaimPath(name)
	})
}
