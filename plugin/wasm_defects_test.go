package plugin_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/wasmhost"
)

const wasmCluster = `{"service": {"cluster": "limit_service", "timeout_ms": 40, "failure_mode": "deny"},
  "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`

// TestWasmRejectionThatCannotBeSentResumes (defect 3): when the host cannot
// send the local reply of a rejection decided in the callout's answer, the
// paused request is resumed (fail open, counted) instead of hanging until
// Envoy's timeout.
func TestWasmRejectionThatCannotBeSentResumes(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, wasmCluster)
	h.OnSendLocalResponse(func(int) wasmhost.Status { return wasmhost.StatusInternalFailure })
	for name, answer := range map[string]func(id uint32) (wasmhost.Response, error){
		"rejected": func(id uint32) (wasmhost.Response, error) {
			return vm.AnswerCallout(id, wasmhost.Headers{{":status", "200"}},
				[]byte(`{"allowed":false,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":900,"reset_ms":1800}]}`))
		},
		"failure_mode deny": func(id uint32) (wasmhost.Response, error) { return vm.FailCallout(id) },
	} {
		r := send(t, vm, "k", "v")
		if !r.Paused || len(r.Callouts) != 1 {
			t.Fatalf("%s: %+v, want a paused callout", name, r)
		}
		r, err := answer(r.Callouts[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.Paused || r.Status != 200 || r.Forwarded == nil {
			t.Fatalf("%s: the request was left paused (status %d, paused %v): it would hang until Envoy's timeout", name, r.Status, r.Paused)
		}
	}
	if v, _ := h.Metric("tokenbucket.rule.fleet.failed_open"); v != 2 {
		t.Fatalf("failed_open = %d, want 2", v)
	}
}

// TestWasmDeepToken (defect 6): a bearer token whose payload is JSON nested
// 10,000 deep, read with trust_unverified_jwt on, leaves the VM working.
func TestWasmDeepToken(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, `{"trust_unverified_jwt": true, "rules": [{"name": "r", "limit_keys": ["jwt:sub"],
	  "match": {"jwt:plan": {"prefix": "p"}}, "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}}]}`)
	deep := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	tok := "Bearer e30." + base64.RawURLEncoding.EncodeToString([]byte(deep)) + ".x"
	for i := 0; i < 4; i++ {
		if r := send(t, vm, "authorization", tok); r.Status != 200 {
			t.Fatalf("deep token %d: %d", i, r.Status)
		}
	}
	ok := "Bearer e30." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"alice","plan":"pro"}`)) + ".x"
	if a, b := send(t, vm, "authorization", ok), send(t, vm, "authorization", ok); a.Status != 200 || b.Status != 429 {
		t.Fatalf("a normal token after the deep ones: %d, %d; want 200, 429", a.Status, b.Status)
	}
}

// TestWasmShadowAnswerAfterTheRequest (defect 5): a shadow-only cluster call
// does not pause the request, and its answer is counted even when it
// arrives after the request has ended.
func TestWasmShadowAnswerAfterTheRequest(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, `{"service": {"cluster": "limit_service"}, "rules": [{"name": "trial", "mode": "shadow", "scope": "cluster",
	  "limit_keys": ["header:k"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`)
	r := send(t, vm, "k", "v")
	if r.Paused || r.Status != 200 {
		t.Fatalf("%+v: want the request through at once", r)
	}
	pending := vm.PendingCallouts()
	if len(pending) != 1 || !strings.Contains(string(pending[0].Body), `"shadow":true`) {
		t.Fatalf("pending callouts %+v, want the shadow call", pending)
	}
	if _, err := vm.AnswerCallout(pending[0].ID, wasmhost.Headers{{":status", "200"}},
		[]byte(`{"allowed":true,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":500,"reset_ms":2000}]}`)); err != nil {
		t.Fatal(err)
	}
	if v, _ := h.Metric("tokenbucket.rule.trial.shadow_rejected"); v != 1 {
		t.Fatalf("shadow_rejected = %d, want 1: the answer was dropped", v)
	}
}

// TestWasmLateAnswerToAnEndedRequest: a request paused on its callout ends
// (the client goes away); its HTTP context is reused by the next request;
// the first callout's answer then arrives. It must not touch the new
// request, which waits for its own answer.
func TestWasmLateAnswerToAnEndedRequest(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, wasmCluster)
	a := send(t, vm, "k", "a")
	if !a.Paused || len(a.Callouts) != 1 {
		t.Fatalf("first request: %+v, want paused on a callout", a)
	}
	if _, err := vm.ResetStream(a.StreamID); err != nil {
		t.Fatal(err)
	}
	b := send(t, vm, "k", "b")
	if !b.Paused || len(b.Callouts) != 1 {
		t.Fatalf("second request: %+v, want paused on its own callout", b)
	}
	late, err := vm.AnswerCallout(a.Callouts[0].ID, wasmhost.Headers{{":status", "200"}},
		[]byte(`{"allowed":false,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":900,"reset_ms":1800}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if late.LocalReply != nil {
		t.Fatalf("the late answer sent a reply: %+v", late.LocalReply)
	}
	r, err := vm.AnswerCallout(b.Callouts[0].ID, wasmhost.Headers{{":status", "200"}},
		[]byte(`{"allowed":true,"buckets":[{"allowed":true,"remaining":1,"retry_after_ms":0,"reset_ms":900}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Paused || r.Status != 200 || r.Headers.Get("ratelimit") != `"fleet";r=1;t=1` {
		t.Fatalf("second request after its answer: %d paused %v ratelimit %q, want 200 with its own bucket's headers",
			r.Status, r.Paused, r.Headers.Get("ratelimit"))
	}
}
