package plugin_test

import (
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/wasmhost"
)

// TestWasmResponseCosts: the compiled plugin charges costs read from a
// response header, a JSON body and an event stream: a budget of 100 with
// requests costing 30 (each reserving 1) admits exactly 4 before the
// first 429, and no body is held.
func TestWasmResponseCosts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		source  string
		headers wasmhost.Headers
		body    string
	}{
		{"header", "response_header:x-usage", wasmhost.Headers{{":status", "200"}, {"x-usage", "30"}}, ""},
		{"json", "response_json:usage.total_tokens", wasmhost.Headers{{":status", "200"}, {"content-type", "application/json"}},
			`{"usage":{"prompt_tokens":12,"completion_tokens":18,"total_tokens":30}}`},
		{"sse", "response_json:usage.total_tokens", wasmhost.Headers{{":status", "200"}, {"content-type", "text/event-stream"}},
			"data: {\"usage\":{\"total_tokens\":1}}\n\ndata: {\"usage\":{\"total_tokens\":30}}\n\ndata: [DONE]\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			vm := newVM(t, h, `{"rules": [{"name": "tokens", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
			  "algorithm_config": {"tokens_per_second": 1, "burst": 100, "cost_source": "`+tc.source+`"}}]}`)
			var statuses []int
			for i := 0; i < 6; i++ {
				hs := wasmhost.Headers{{":method", "POST"}, {":path", "/v1/chat"}, {":authority", "a"}, {"x-api-key", "k"}}
				r, err := vm.HTTP(wasmhost.Request{Headers: hs, UpstreamHeaders: tc.headers, UpstreamBody: []byte(tc.body)})
				if err != nil {
					t.Fatal(err)
				}
				if r.Status == 200 && string(r.Body) != tc.body {
					t.Fatalf("request %d: body %q, want %q", i, r.Body, tc.body)
				}
				statuses = append(statuses, r.Status)
			}
			if want := []int{200, 200, 200, 200, 429, 429}; !equalInts(statuses, want) {
				t.Fatalf("statuses %v, want %v", statuses, want)
			}
			if n, ok := h.Metric("tokenbucket.rule.tokens.cost_missing"); !ok || n != 0 {
				t.Fatalf("cost_missing = %d, %v", n, ok)
			}
		})
	}
}

// TestWasmChargeOn: charge_on ["401"] lets 200s through, and a burst of
// 401s exhausts the bucket.
func TestWasmChargeOn(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, `{"rules": [{"name": "logins", "limit_keys": ["header:x-user"], "charge_on": ["401"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 0.01, "burst": 3}}]}`)
	do := func(status string) int {
		hs := wasmhost.Headers{{":method", "POST"}, {":path", "/login"}, {":authority", "a"}, {"x-user", "u"}}
		r, err := vm.HTTP(wasmhost.Request{Headers: hs, UpstreamHeaders: wasmhost.Headers{{":status", status}}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status
	}
	for i := 0; i < 10; i++ {
		if s := do("200"); s != 200 {
			t.Fatalf("200 number %d answered %d", i, s)
		}
	}
	for i := 0; i < 3; i++ {
		if s := do("401"); s != 401 {
			t.Fatalf("401 number %d answered %d", i, s)
		}
	}
	if s := do("200"); s != 429 {
		t.Fatalf("after the burst of 401s: %d, want 429", s)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestWasmBodyGarbageBounded: response bodies read for costs are garbage
// once scanned; between the VM's collections on its tick they must not pile
// up to the runtime's memory limit, where Go's collector, running at every
// allocation, gives up its limit to its CPU limiter and the VM's memory
// grows for good (an Envoy with 1,300 stalled clients grew its VMs by
// hundreds of MiB). 512 MiB of bodies read with no tick leave the VM's
// memory well under the limit.
func TestWasmBodyGarbageBounded(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, `{"rules": [{"name": "tokens", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 1000, "burst": 1e6, "cost_source": "response_json:usage.total_tokens", "max_body_bytes": 16777216}}]}`)
	body := []byte(`{"pad":"` + strings.Repeat("x", 8<<20) + `","usage":{"total_tokens":1}}`)
	start := vm.MemoryBytes()
	for i := 0; i < 64; i++ {
		hs := wasmhost.Headers{{":method", "POST"}, {":path", "/v1/chat"}, {":authority", "a"}, {"x-api-key", "k"}}
		r, err := vm.HTTP(wasmhost.Request{Headers: hs, UpstreamHeaders: wasmhost.Headers{{":status", "200"}, {"content-type", "application/json"}}, UpstreamBody: body})
		if err != nil || r.Status != 200 {
			t.Fatalf("request %d: %d %v", i, r.Status, err)
		}
	}
	grown := vm.MemoryBytes() - start
	t.Logf("the VM's memory grew by %d MiB", grown>>20)
	if grown > 40<<20 {
		t.Errorf("the VM's memory grew by %d MiB reading 512 MiB of bodies: garbage piles up between collections", grown>>20)
	}
	if n, _ := h.Metric("tokenbucket.rule.tokens.cost_missing"); n != 0 {
		t.Errorf("cost_missing = %d, want 0", n)
	}
}
