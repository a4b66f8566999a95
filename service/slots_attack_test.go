package service

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// rawPost sends one POST with body on c, as a client of its own would
// (HTTP/1.1, keep-alive), and returns the status and the body answered.
func rawPost(t *testing.T, c net.Conn, r *bufio.Reader, path, token, body string) (int, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := "POST " + path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token +
		"\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// TestSlotsAttacker is a client speaking raw HTTP to limitd's slot
// endpoints (Redis store, two gateways' tokens): hostile values are refused
// (400 naming the field, 413 past the body's bound) and take nothing; a
// flood of 2,000 acquires with distinct ids on one key takes exactly its
// max_in_flight; the attacker cannot release or renew another caller's
// slot; and the victim's slot stays held throughout.
func TestSlotsAttacker(t *testing.T) {
	srv := redistest.Start(t)
	rs := realStore(t, realClient(t, srv.Addr()), 0)
	s, err := NewServer(Config{Store: rs, StoreName: "redis", Registry: prometheus.NewRegistry(),
		Tokens: []Token{{Name: "victim", Value: "tok-v"}, {Name: "attacker", Value: "tok-a"}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	_, addr := serveGuarded(t, s, ConnOptions{})
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	vc, vr := dial()
	if code, body := rawPost(t, vc, vr, "/v1/slots/acquire", "tok-v", `{"id":"v1","ttl_ms":30000,"keys":[{"key":"tenant","max_in_flight":5}]}`); code != 200 || !strings.Contains(body, `"acquired":true`) {
		t.Fatalf("victim's acquire: %d %s", code, body)
	}
	ac, ar := dial()
	for _, tt := range []struct{ path, body, want string }{
		{"/v1/slots/acquire", `{"id":"x","ttl_ms":30000,"keys":[{"key":"tenant","max_in_flight":1e15}]}`, "keys[0].max_in_flight: must be a whole number"},
		{"/v1/slots/acquire", `{"id":"x","ttl_ms":-5,"keys":[{"key":"tenant","max_in_flight":5}]}`, "ttl_ms: must be a whole number"},
		{"/v1/slots/acquire", `{"id":"x","ttl_ms":1e300,"keys":[{"key":"tenant","max_in_flight":5}]}`, "ttl_ms: must be a whole number"},
		{"/v1/slots/acquire", `{"id":"x y","ttl_ms":30000,"keys":[{"key":"tenant","max_in_flight":5}]}`, "id: only printable ASCII"},
		{"/v1/slots/acquire", `{"id":"x","ttl_ms":30000,"keys":[` + strings.Repeat(`{"key":"k","max_in_flight":5},`, 40) + `{"key":"z","max_in_flight":5}]}`, "keys: must hold 1 to 16 keys"},
		{"/v1/slots/renew", `{"ttl_ms":30000,"slots":[` + strings.Repeat(`{"key":"tenant","max_in_flight":5,"id":"v1"},`, 300) + `{"key":"tenant","max_in_flight":5,"id":"v1"}]}`, "slots: must hold 1 to 256 slots"},
		{"/v1/slots/renew", `{"ttl_ms":0,"slots":[{"key":"tenant","max_in_flight":5,"id":"v1"}]}`, "ttl_ms: must be a whole number"},
		{"/v1/slots/release", `{"slots":[{"key":"tenant","max_in_flight":-1,"id":"v1"}]}`, "slots[0].max_in_flight: must be a whole number"},
		{"/v1/slots/release", `{"slots":{"key":"tenant"}}`, "slots: must be an array"},
	} {
		code, body := rawPost(t, ac, ar, tt.path, "tok-a", tt.body)
		if code != 400 || !strings.Contains(body, tt.want) {
			t.Fatalf("%s %.80s: %d %s, want 400 %q", tt.path, tt.body, code, body, tt.want)
		}
	}
	if code, _ := rawPost(t, ac, ar, "/v1/slots/acquire", "tok-a", `{"id":"`+strings.Repeat("x", 70<<10)+`"}`); code != 413 {
		t.Fatalf("a body past 64 KiB: %d, want 413", code)
	}
	ac, ar = dial() // 413 closes the connection
	// Another caller's slot: the attacker's release finds none of its own,
	// and its renew takes a slot of its own (the victim's stays).
	if code, got := rawPost(t, ac, ar, "/v1/slots/release", "tok-a", `{"slots":[{"key":"tenant","max_in_flight":5,"id":"v1"}]}`); code != 200 || got != `{"slots":["lost"]}`+"\n" {
		t.Fatalf("attacker's release of the victim's slot: %d %s", code, got)
	}
	if code, got := rawPost(t, ac, ar, "/v1/slots/renew", "tok-a", `{"ttl_ms":600000,"slots":[{"key":"tenant","max_in_flight":5,"id":"v1"}]}`); code != 200 || got != `{"slots":["restored"]}`+"\n" {
		t.Fatalf("attacker's renew of the victim's slot id: %d %s", code, got)
	}
	// A flood of acquires, bounded in count: exactly 3 more slots out.
	acquired := 0
	for i := range 2000 {
		code, body := rawPost(t, ac, ar, "/v1/slots/acquire", "tok-a", `{"id":"a`+strconv.Itoa(i)+`","ttl_ms":600000,"keys":[{"key":"tenant","max_in_flight":5}]}`)
		if code != 200 {
			t.Fatalf("flood %d: %d %s", i, code, body)
		}
		if strings.Contains(body, `"acquired":true`) {
			acquired++
		}
	}
	if acquired != 3 {
		t.Fatalf("the flood took %d slots beside the victim's and its own, want 3", acquired)
	}
	code, body := rawPost(t, vc, vr, "/v1/slots/renew", "tok-v", `{"ttl_ms":30000,"slots":[{"key":"tenant","max_in_flight":5,"id":"v1"}]}`)
	if code != 200 || body != `{"slots":["held"]}`+"\n" {
		t.Fatalf("victim's renew after the flood: %d %s", code, body)
	}
}
