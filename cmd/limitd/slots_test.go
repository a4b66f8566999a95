package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-wasm/tokenbucket/service"
)

// TestReadyGateServesSlots: the Redis store reaches the server behind
// readyGate, which must keep its slots: without them the server has no
// /v1/slots endpoints and every cluster concurrency rule's acquire is a
// 404 (found by TestConcurrencyCluster).
func TestReadyGateServesSlots(t *testing.T) {
	ms := service.NewMemoryStore(service.MemoryOptions{})
	gate := newReadyGate(ms)
	gate.ready.Store(true)
	s, err := service.NewServer(service.Config{Store: gate, Registry: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/slots/acquire",
		strings.NewReader(`{"id":"a","ttl_ms":30000,"keys":[{"key":"k","max_in_flight":1}]}`)))
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"acquired":true`) {
		t.Fatalf("acquire through readyGate: %d %s", w.Code, w.Body)
	}
}
