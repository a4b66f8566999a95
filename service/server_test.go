package service

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// failingStore fails every decision and ping.
type failingStore struct{ err error }

func (f failingStore) Decide(context.Context, *wire.Request) (wire.Answer, error) {
	return wire.Answer{}, f.err
}
func (f failingStore) Lease(context.Context, *wire.LeaseRequest) (wire.LeaseAnswer, error) {
	return wire.LeaseAnswer{}, f.err
}
func (f failingStore) Charge(context.Context, *wire.ChargeRequest) (wire.ChargeAnswer, error) {
	return wire.ChargeAnswer{}, f.err
}
func (f failingStore) Ping(context.Context) error { return f.err }
func (f failingStore) Close() error               { return nil }

func newTestServer(t *testing.T, store Store, token string) (*Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := NewServer(Config{
		Store: store, StoreName: "memory", Token: token, Registry: reg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, reg
}

func do(h http.Handler, method, path, body string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func errorOf(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var body struct{ Error string }
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("error body %q: %v", w.Body.String(), err)
	}
	return body.Error
}

const okBody = `{"buckets":[{"key":"a","tokens_per_second":1,"burst":2}]}`

func TestServerDecide(t *testing.T) {
	clk := &fakeClock{now: t0.UnixNano()}
	s, reg := newTestServer(t, NewMemoryStore(MemoryOptions{Now: clk.Now}), "")
	want := []string{
		`{"allowed":true,"retry_after_ms":0,"buckets":[{"allowed":true,"remaining":1,"retry_after_ms":0,"reset_ms":1000}]}`,
		`{"allowed":true,"retry_after_ms":0,"buckets":[{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":2000}]}`,
		`{"allowed":false,"retry_after_ms":1000,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":1000,"reset_ms":2000}]}`,
	}
	for i, w := range want {
		rec := do(s, "POST", "/v1/decide", okBody)
		if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != w {
			t.Fatalf("call %d: %d %s\nwant 200 %s", i, rec.Code, rec.Body, w)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type = %q", ct)
		}
	}
	if got := counterValue(s.metrics.decisions); got != 3 {
		t.Errorf("decisions = %v, want 3", got)
	}
	if got := counterValue(s.metrics.rejections); got != 1 {
		t.Errorf("rejections = %v, want 1", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var observed uint64
	for _, mf := range mfs {
		if mf.GetName() == "limitd_decide_duration_seconds" {
			observed = mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	if observed != 3 {
		t.Errorf("latency histogram holds %d observations, want 3", observed)
	}
}

func TestServerErrors(t *testing.T) {
	s, _ := newTestServer(t, NewMemoryStore(MemoryOptions{}), "")
	big := `{"buckets":[{"key":"` + strings.Repeat("x", wire.DefaultMaxBodyBytes) + `"}]}`
	tests := []struct {
		name, method, body string
		code               int
		msg                string
	}{
		{"validation", "POST", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":5}]}`, 400, "buckets[0].burst: must be >= tokens_per_second (10), got 5"},
		{"bad json", "POST", `{"buckets":`, 400, "body: invalid JSON: unexpected end of JSON input (at byte 11)"},
		{"too big", "POST", big, 413, "body: larger than 65536 bytes"},
		{"method", "GET", "", 405, "method: must be POST"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := do(s, tt.method, "/v1/decide", tt.body)
			if w.Code != tt.code || errorOf(t, w) != tt.msg {
				t.Fatalf("%d %s, want %d %q", w.Code, w.Body, tt.code, tt.msg)
			}
		})
	}
	if got := counterValue(s.metrics.refused.WithLabelValues("400")); got != 2 {
		t.Errorf("invalid requests (400) = %v, want 2", got)
	}
}

func TestServerAuth(t *testing.T) {
	s, _ := newTestServer(t, NewMemoryStore(MemoryOptions{}), "s3cret")
	tests := []struct {
		header []string
		code   int
	}{
		{nil, 401},
		{[]string{"Authorization", "Bearer wrong"}, 401},
		{[]string{"Authorization", "Basic s3cret"}, 401},
		{[]string{"Authorization", "Bearer "}, 401},
		{[]string{"Authorization", "Bearer s3cret"}, 200},
		{[]string{"Authorization", "bearer s3cret"}, 200},
	}
	for _, tt := range tests {
		w := do(s, "POST", "/v1/decide", okBody, tt.header...)
		if w.Code != tt.code {
			t.Errorf("%v: %d %s, want %d", tt.header, w.Code, w.Body, tt.code)
		}
		if tt.code == 401 && (w.Header().Get("WWW-Authenticate") == "" || errorOf(t, w) != "authorization: missing or wrong bearer token") {
			t.Errorf("%v: 401 without the challenge or message: %v %s", tt.header, w.Header(), w.Body)
		}
	}
	// Health and metrics stay open.
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if w := do(s, "GET", p, ""); w.Code != 200 {
			t.Errorf("GET %s = %d without token, want 200", p, w.Code)
		}
	}
}

func TestServerStoreFailure(t *testing.T) {
	s, _ := newTestServer(t, failingStore{errors.New("service: redis: dial tcp: connection refused")}, "")
	w := do(s, "POST", "/v1/decide", okBody)
	if w.Code != 503 || !strings.Contains(errorOf(t, w), "connection refused") {
		t.Fatalf("decide with a failing store: %d %s, want 503", w.Code, w.Body)
	}
	if w := do(s, "GET", "/readyz", ""); w.Code != 503 {
		t.Fatalf("readyz with a failing store: %d, want 503", w.Code)
	}
	if w := do(s, "GET", "/healthz", ""); w.Code != 200 {
		t.Fatalf("healthz: %d, want 200", w.Code)
	}
	if got := counterValue(s.metrics.storeErrors); got != 1 {
		t.Errorf("store errors = %v, want 1", got)
	}
}

func TestServerStoreValidation(t *testing.T) {
	verr := &wire.FieldError{Field: "hash_tag", Msg: "required: the buckets fall in different Redis Cluster slots"}
	s, _ := newTestServer(t, failingStore{verr}, "")
	w := do(s, "POST", "/v1/decide", okBody)
	if w.Code != 400 || errorOf(t, w) != verr.Detail() {
		t.Fatalf("%d %s, want 400 %q", w.Code, w.Body, verr.Detail())
	}
}

func TestServerMetricsEndpoint(t *testing.T) {
	s, _ := newTestServer(t, NewMemoryStore(MemoryOptions{}), "")
	do(s, "POST", "/v1/decide", okBody)
	w := do(s, "GET", "/metrics", "")
	for _, name := range []string{"limitd_decisions_total", "limitd_rejections_total", "limitd_store_errors_total", "limitd_decide_duration_seconds_bucket"} {
		if !strings.Contains(w.Body.String(), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// TestServerMetricsAccess: /metrics shows request values in its labels
// (detailed metrics: API keys, user ids), so where the listener is not
// loopback it asks for a caller's bearer token, as /v1 does (a front
// proxy's with a listed identity), without counting the scrape as a call;
// served on a listener of its own, the Server does not serve it and
// MetricsHandler does.
func TestServerMetricsAccess(t *testing.T) {
	newServer := func(access MetricsAccess) *Server {
		s, err := NewServer(Config{
			Store: NewMemoryStore(MemoryOptions{}), StoreName: "memory", Metrics: access,
			Tokens:         []Token{{Name: "gw", Value: "s3cret"}, {Name: "edge", Value: "edge-tok", FrontProxy: true}},
			Identities:     []Identity{{Name: "gw-b", Value: "spiffe://b"}},
			IdentityHeader: "x-limitd-identity",
			Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := newServer(MetricsBearer)
	for _, tt := range []struct {
		header []string
		code   int
	}{
		{nil, 401},
		{[]string{"Authorization", "Bearer wrong"}, 401},
		{[]string{"Authorization", "Bearer edge-tok"}, 401}, // a front proxy's, without a listed identity
		{[]string{"Authorization", "Bearer s3cret"}, 200},
		{[]string{"Authorization", "Bearer edge-tok", "x-limitd-identity", "spiffe://b"}, 200},
	} {
		w := do(s, "GET", "/metrics", "", tt.header...)
		if w.Code != tt.code {
			t.Errorf("bearer: GET /metrics %v = %d, want %d", tt.header, w.Code, tt.code)
		}
		if w.Code == 200 && !strings.Contains(w.Body.String(), "limitd_decisions_total") {
			t.Errorf("bearer: GET /metrics %v lacks limitd_decisions_total", tt.header)
		}
		if w.Code == 401 && w.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("bearer: 401 without the challenge")
		}
	}
	if got := counterValue(s.metrics.authorized.WithLabelValues("gw")); got != 0 {
		t.Errorf("scrapes counted as gw's calls: %v, want 0", got)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if w := do(s, "GET", p, ""); w.Code != 200 {
			t.Errorf("bearer: GET %s = %d without token, want 200", p, w.Code)
		}
	}
	apart := newServer(MetricsElsewhere)
	if w := do(apart, "GET", "/metrics", "", "Authorization", "Bearer s3cret"); w.Code != 404 {
		t.Errorf("elsewhere: GET /metrics on the API's listener = %d, want 404", w.Code)
	}
	if w := do(apart.MetricsHandler(), "GET", "/metrics", ""); w.Code != 200 || !strings.Contains(w.Body.String(), "limitd_decisions_total") {
		t.Errorf("elsewhere: MetricsHandler = %d, want 200 with the metrics", w.Code)
	}
	if w := do(newServer(MetricsOpen), "GET", "/metrics", ""); w.Code != 200 {
		t.Errorf("open: GET /metrics = %d without token, want 200", w.Code)
	}
}

// TestMetricsBearerRawClient: a client speaking raw HTTP/1.1 to a real
// listener (MetricsBearer) gets 401 for /metrics without the token, its
// connection closed, however many times it asks (200 connections); with the
// token it scrapes twice on one connection, kept open.
func TestMetricsBearerRawClient(t *testing.T) {
	s, err := NewServer(Config{Store: NewMemoryStore(MemoryOptions{}), Token: "s3cret", Metrics: MetricsBearer,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	_, addr := serveGuarded(t, s, ConnOptions{MaxConns: 64})
	for i := range 200 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		auth := ""
		if i%2 == 1 {
			auth = "wrong"
		}
		if code := rawGet(t, c, bufio.NewReader(c), "/metrics", auth); code != 401 {
			c.Close()
			t.Fatalf("attempt %d: /metrics with token %q = %d, want 401", i, auth, code)
		}
		if !waitClosed(c) {
			c.Close()
			t.Fatalf("attempt %d: the refused connection stayed open", i)
		}
		c.Close()
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	for i := range 2 {
		if code := rawGet(t, c, r, "/metrics", "s3cret"); code != 200 {
			t.Fatalf("scrape %d with the token: %d, want 200 on the same connection", i, code)
		}
	}
}

func TestNewServerNeedsStore(t *testing.T) {
	if _, err := NewServer(Config{}); err == nil {
		t.Fatal("NewServer without a store succeeded")
	}
}

func TestThrottle(t *testing.T) {
	var th LogThrottle
	base := time.Unix(100, 0)
	if _, ok := th.Allow(base); !ok {
		t.Fatal("first event throttled")
	}
	for range 3 {
		if _, ok := th.Allow(base.Add(time.Millisecond)); ok {
			t.Fatal("event within a second let through")
		}
	}
	if n, ok := th.Allow(base.Add(time.Second)); !ok || n != 3 {
		t.Fatalf("allow after a second = %d, %v; want 3 suppressed, true", n, ok)
	}
}

// counterValue reads a counter.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

func BenchmarkServerDecide(b *testing.B) {
	s, err := NewServer(Config{Store: NewMemoryStore(MemoryOptions{}), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"buckets":[{"key":"a","tokens_per_second":1e9,"burst":1e9}]}`)
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest("POST", "/v1/decide", bytes.NewReader(body))
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != 200 {
			b.Fatal(w.Code)
		}
	}
}

func BenchmarkDecodeRequest(b *testing.B) {
	body := []byte(`{"hash_tag":"t","buckets":[{"key":"rule-a:client=1.2.3.4","tokens_per_second":100,"burst":200,"cost":1},{"key":"rule-b:global","tokens_per_second":1000,"burst":1000}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.DecodeRequest(body, wire.Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMemoryDecide(b *testing.B) {
	s := NewMemoryStore(MemoryOptions{})
	req := one("k", 1e9, 1e9, 1)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Decide(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// TestOpenAPIDocumentsTheWire keeps openapi.yaml in step with the JSON the
// service reads and writes.
func TestOpenAPIDocumentsTheWire(t *testing.T) {
	spec, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{
		"/v1/decide", "/healthz", "/readyz", "/metrics",
		"hash_tag:", "buckets:", "key:", "tokens_per_second:", "burst:", "cost:", "refundable:",
		"allowed:", "remaining:", "retry_after_ms:", "reset_ms:", "error:", "max_delay_ms:", "wait_ms:",
		"maximum: " + strconv.Itoa(wire.MaxDelayMs),
		"/v1/lease", "want:", "min:", "return:", "granted:",
		"maxItems: " + strconv.Itoa(wire.MaxBuckets), "maxLength: " + strconv.Itoa(wire.MaxKeyBytes),
	} {
		if !bytes.Contains(spec, []byte(field)) {
			t.Errorf("openapi.yaml lacks %q", field)
		}
	}
}

// TestServerLease: POST /v1/lease grants, refuses, takes returns, checks
// its body like /v1/decide, and counts in the lease metrics.
func TestServerLease(t *testing.T) {
	clk := &fakeClock{}
	clk.Set(t0)
	s, reg := newTestServer(t, NewMemoryStore(MemoryOptions{Now: clk.Now}), "")
	steps := []struct{ body, want string }{
		{`{"buckets":[{"key":"k","tokens_per_second":1,"burst":10,"want":8,"min":1}]}`,
			`{"granted":true,"buckets":[{"granted":8,"remaining":2,"retry_after_ms":0,"reset_ms":8000}]}`},
		{`{"buckets":[{"key":"k","tokens_per_second":1,"burst":10,"want":8,"min":3}]}`,
			`{"granted":false,"buckets":[{"granted":0,"remaining":2,"retry_after_ms":1000,"reset_ms":8000}]}`},
		{`{"buckets":[{"key":"k","tokens_per_second":1,"burst":10,"return":5}]}`,
			`{"granted":true,"buckets":[{"granted":0,"remaining":7,"retry_after_ms":0,"reset_ms":3000}]}`},
	}
	for i, st := range steps {
		w := do(s, "POST", "/v1/lease", st.body)
		if w.Code != 200 || strings.TrimSpace(w.Body.String()) != st.want {
			t.Fatalf("step %d: %d %s\nwant %s", i, w.Code, w.Body, st.want)
		}
	}
	if w := do(s, "POST", "/v1/lease", `{"buckets":[{"key":"k","tokens_per_second":1,"burst":10,"want":11}]}`); w.Code != 400 ||
		!strings.Contains(w.Body.String(), "buckets[0].want: must be >= 0 and <= 10, got 11") {
		t.Fatalf("invalid lease: %d %s", w.Code, w.Body)
	}
	mfs, _ := reg.Gather()
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetCounter() != nil {
				got[mf.GetName()] += m.GetCounter().GetValue()
			}
		}
	}
	if got["limitd_leases_total"] != 3 || got["limitd_leased_tokens_total"] != 8 || got["limitd_returned_tokens_total"] != 5 {
		t.Fatalf("lease metrics %v", got)
	}
}

func TestServerCharge(t *testing.T) {
	clk := &fakeClock{now: t0.UnixNano()}
	s, _ := newTestServer(t, NewMemoryStore(MemoryOptions{Now: clk.Now}), "")
	decide := `{"buckets":[{"key":"k","tokens_per_second":1,"burst":10,"cost":1}]}`
	if w := do(s, "POST", "/v1/decide", decide); w.Code != 200 {
		t.Fatalf("decide: %d %s", w.Code, w.Body)
	}
	// The real cost was 15: 14 more, into a debt of 5 (10 − 1 − 14).
	w := do(s, "POST", "/v1/charge", `{"buckets":[{"key":"k","tokens_per_second":1,"burst":10,"amount":14}]}`)
	if want := `{"buckets":[{"charged":true,"remaining":0,"retry_after_ms":0,"reset_ms":15000}]}` + "\n"; w.Code != 200 || w.Body.String() != want {
		t.Fatalf("charge: %d %s, want %s", w.Code, w.Body, want)
	}
	// The next request waits out the debt and its own token: 6 s.
	if w := do(s, "POST", "/v1/decide", decide); !strings.Contains(w.Body.String(), `"retry_after_ms":6000`) {
		t.Fatalf("decide in debt: %s", w.Body)
	}
	// A refund beyond the burst is clamped (and then to the reservation
	// outstanding: the decision's 1), not refused.
	if w := do(s, "POST", "/v1/charge", `{"buckets":[{"key":"k","tokens_per_second":1,"burst":10,"amount":-11}]}`); w.Code != 200 {
		t.Fatalf("a refund beyond the burst: %d %s, want 200", w.Code, w.Body)
	}
}
