package service

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// callerServer is a server of two gateways' tokens and a front proxy's,
// which forwards its callers' identities in X-Client-Identity.
func callerServer(t *testing.T) (*Server, *prometheus.Registry) {
	t.Helper()
	clk := &fakeClock{}
	clk.Set(t0)
	reg := prometheus.NewRegistry()
	s, err := NewServer(Config{
		Store: NewMemoryStore(MemoryOptions{Now: clk.Now}), StoreName: "memory", Registry: reg,
		Tokens:         []Token{{Name: "gw-a", Value: "tok-a"}, {Name: "gw-b", Value: "tok-b"}, {Name: "edge", Value: "tok-edge", FrontProxy: true}},
		Identities:     []Identity{{Name: "gw-c", Value: "spiffe://mesh/gw-c"}},
		IdentityHeader: "x-client-identity",
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, reg
}

const (
	reserveBody = `{"buckets":[{"key":"k","tokens_per_second":0.01,"burst":100,"cost":10,"refundable":true}]}`
	refundBody  = `{"buckets":[{"key":"k","tokens_per_second":0.01,"burst":100,"amount":-10}]}`
)

// TestServerCallers: the caller of a /v1 call is its token's name, or, for
// a front proxy's token, the identity it forwards; a refund gives back only
// what the same caller reserved. The identity header counts only on a front
// proxy's calls.
func TestServerCallers(t *testing.T) {
	s, reg := callerServer(t)
	refunded := func() float64 { return gatherCounter(t, reg, "limitd_refunded_tokens_total") }
	call := func(path, body string, header ...string) {
		t.Helper()
		if w := do(s, "POST", path, body, header...); w.Code != http.StatusOK {
			t.Fatalf("%s %v: %d %s", path, header, w.Code, w.Body)
		}
	}
	call("/v1/decide", reserveBody, "Authorization", "Bearer tok-a")
	call("/v1/charge", refundBody, "Authorization", "Bearer tok-b")
	call("/v1/charge", refundBody, "Authorization", "Bearer tok-b", "X-Client-Identity", "spiffe://mesh/gw-c")
	call("/v1/charge", refundBody, "Authorization", "Bearer tok-edge", "X-Client-Identity", "spiffe://mesh/gw-c")
	if got := refunded(); got != 0 {
		t.Fatalf("refunds of A's reservation by B, by B claiming C's identity and by C: %v given back, want 0", got)
	}
	call("/v1/charge", refundBody, "Authorization", "Bearer tok-a")
	if got := refunded(); got != 10 {
		t.Fatalf("A's own refund: %v given back, want 10", got)
	}
	call("/v1/decide", reserveBody, "Authorization", "Bearer tok-edge", "X-Client-Identity", "spiffe://mesh/gw-c")
	call("/v1/charge", refundBody, "Authorization", "Bearer tok-a")
	call("/v1/charge", refundBody, "Authorization", "Bearer tok-edge", "X-Client-Identity", "spiffe://mesh/gw-c")
	if got := refunded(); got != 20 {
		t.Fatalf("C's refund through the front proxy: %v given back in all, want 20", got)
	}
	if got := gatherCounter(t, reg, "limitd_authorized_calls_total"); got != 8 {
		t.Errorf("authorized calls: %v, want 8", got)
	}
}

// TestServerFrontProxyRefusals: a front proxy's call without an identity,
// with an unknown one, or with two, is refused 401.
func TestServerFrontProxyRefusals(t *testing.T) {
	s, _ := callerServer(t)
	for name, ids := range map[string][]string{
		"none":    nil,
		"unknown": {"spiffe://mesh/gw-z"},
		"two":     {"spiffe://mesh/gw-c", "spiffe://mesh/gw-c"},
		"a name":  {"gw-c"},
	} {
		r := httptest.NewRequest("POST", "/v1/decide", strings.NewReader(okBody))
		r.Header.Set("Authorization", "Bearer tok-edge")
		for _, id := range ids {
			r.Header.Add("X-Client-Identity", id)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != http.StatusUnauthorized || !strings.Contains(errorOf(t, w), "x-client-identity") && !strings.Contains(errorOf(t, w), "X-Client-Identity") {
			t.Errorf("%s: %d %s, want 401 naming the header", name, w.Code, w.Body)
		}
	}
}

// TestServerCallerConfig: names must be distinct across tokens and
// identities and fit a ledger; a front proxy needs the header; identities
// need a front proxy.
func TestServerCallerConfig(t *testing.T) {
	store := NewMemoryStore(MemoryOptions{})
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"proxy without header", Config{Tokens: []Token{{Name: "edge", Value: "t", FrontProxy: true}}}, "identity header: required"},
		{"identities without proxy", Config{Tokens: []Token{{Name: "a", Value: "t"}}, Identities: []Identity{{Name: "c", Value: "v"}}},
			"identities: need a front proxy"},
		{"name twice", Config{Tokens: []Token{{Name: "a", Value: "t", FrontProxy: true}}, IdentityHeader: "x-id",
			Identities: []Identity{{Name: "a", Value: "v"}}}, `identities[0].name: "a" named twice`},
		{"value twice", Config{Tokens: []Token{{Name: "a", Value: "t", FrontProxy: true}}, IdentityHeader: "x-id",
			Identities: []Identity{{Name: "b", Value: "v"}, {Name: "c", Value: "v"}}}, `identities[1].value: "v" listed twice`},
		{"space in name", Config{Tokens: []Token{{Name: "gw a", Value: "t"}}}, "tokens[0].name: service: caller"},
	} {
		tc.cfg.Store = store
		tc.cfg.Registry = prometheus.NewRegistry()
		if _, err := NewServer(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
