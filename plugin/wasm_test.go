package plugin_test

// These tests run the plugin compiled from this tree (built once per test
// binary, as the Makefile builds it, into build/plugin-test.wasm: never a
// build/plugin.wasm that may be stale) in internal/testing/wasmhost, a proxy-wasm
// host on wazero with Envoy's shared-data semantics, a clock the test sets,
// and several VMs playing Envoy's workers.

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/wasmhost"
	"github.com/ratelimit-wasm/tokenbucket/service"
)

var (
	compiledOnce sync.Once
	wasmBytes    []byte
	wasmErr      error
)

// newHost returns a fresh host (its own shared data and clock) for the
// compiled plugin.
func newHost(t *testing.T) *wasmhost.Host {
	t.Helper()
	compiledOnce.Do(func() {
		wasmBytes, wasmErr = wasmhost.BuildModule("..", ".", "plugin-test.wasm")
	})
	if wasmErr != nil {
		t.Fatal(wasmErr)
	}
	h, err := wasmhost.NewHost(context.Background(), wasmBytes,
		wasmhost.WithStartTime(time.Unix(1_800_000_000, 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func newVM(t *testing.T, h *wasmhost.Host, cfg string) *wasmhost.VM {
	t.Helper()
	vm, err := h.NewVM([]byte(cfg), "tokenbucket")
	if err != nil {
		t.Fatal(err)
	}
	return vm
}

func send(t *testing.T, vm *wasmhost.VM, headers ...string) wasmhost.Response {
	t.Helper()
	hs := wasmhost.Headers{{":method", "GET"}, {":path", "/"}, {":authority", "example"}, {":scheme", "http"}}
	for i := 0; i+1 < len(headers); i += 2 {
		hs = append(hs, [2]string{headers[i], headers[i+1]})
	}
	r, err := vm.HTTP(wasmhost.Request{Headers: hs, SourceAddress: "10.1.2.3:5555"})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

const wasmPerKey = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 10, "burst": 50}}]}`

// TestWasmWorkersExact: four workers race on one key at one moment; exactly
// the burst is admitted.
func TestWasmWorkersExact(t *testing.T) {
	h := newHost(t)
	var admitted, rejected atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		vm := newVM(t, h, wasmPerKey)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 60; i++ {
				hs := wasmhost.Headers{{":method", "GET"}, {":path", "/"}, {":authority", "a"}, {"x-api-key", "k"}}
				r, err := vm.HTTP(wasmhost.Request{Headers: hs})
				if err != nil {
					t.Error(err)
					return
				}
				switch r.Status {
				case 200:
					admitted.Add(1)
				case 429:
					rejected.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 50 || rejected.Load() != 190 {
		t.Fatalf("admitted %d, rejected %d; want exactly 50 and 190", admitted.Load(), rejected.Load())
	}
}

// TestWasmCreateRace: another worker creates the bucket's key between
// worker A's read ("missing") and A's write, taking the only token (it
// writes the very state A is about to write). A set on a missing key ignores
// the CAS, but the key is no longer missing: A's write must fail and A must
// decide again on the other worker's state, so a burst of 1 admits one
// request, not two.
func TestWasmCreateRace(t *testing.T) {
	h := newHost(t)
	cfg := `{"rules": [{"name": "one", "limit_keys": ["header:k"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 1, "burst": 1}}]}`
	a := newVM(t, h, cfg)
	raced := false
	h.OnSetSharedData(func(key string, value []byte, _ uint32) (wasmhost.Status, bool) {
		if !raced && key != "tokenbucket:seed" { // the placement seed is written first
			raced = true
			if st := h.SetSharedData(key, value, 0); st != wasmhost.StatusOK {
				t.Errorf("the other worker's write: %v", st)
			}
		}
		return 0, false
	})
	r := send(t, a, "k", "same")
	h.OnSetSharedData(nil)
	if !raced || r.Status != 429 {
		t.Fatalf("raced %v, status %d: want 429 (the other worker took the only token)", raced, r.Status)
	}
	if v, _ := h.Metric("tokenbucket.cas_retries"); v != 1 {
		t.Fatalf("cas_retries = %d, want 1", v)
	}
}

func TestWasmRefillHeadersAndReconfigure(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, wasmPerKey)
	for i := 0; i < 50; i++ {
		send(t, vm, "x-api-key", "r")
	}
	r := send(t, vm, "x-api-key", "r")
	if r.Status != 429 || r.Headers.Get("retry-after") != "1" || r.Headers.Get("ratelimit") != `"per-key";r=0;t=1` {
		t.Fatalf("after the burst: %d %v", r.Status, r.Headers)
	}
	h.Advance(300 * time.Millisecond) // 3 tokens
	for i := 0; i < 3; i++ {
		if r := send(t, vm, "x-api-key", "r"); r.Status != 200 {
			t.Fatalf("refilled token %d: %d", i, r.Status)
		}
	}
	if r := send(t, vm, "x-api-key", "r"); r.Status != 429 {
		t.Fatalf("4th after 300ms: %d, want 429", r.Status)
	}
	// A new configuration with the same rule name and keys keeps the state:
	// no fresh burst. A lower burst clamps the tokens.
	if err := vm.Reconfigure([]byte(`{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],
	  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 20}}]}`)); err != nil {
		t.Fatal(err)
	}
	if r := send(t, vm, "x-api-key", "r"); r.Status != 429 {
		t.Fatalf("after reconfiguration: %d, want 429 (bucket kept)", r.Status)
	}
	h.Advance(time.Hour)
	if r := send(t, vm, "x-api-key", "r"); r.Headers.Get("ratelimit-remaining") != "19" {
		t.Fatalf("full bucket under the new burst: remaining %q, want 19", r.Headers.Get("ratelimit-remaining"))
	}
	if v, _ := h.Metric("tokenbucket.rule.per-key.rejected"); v != 3 {
		t.Fatalf("rejected metric %d, want 3", v)
	}
}

func TestWasmFailOpen(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, wasmPerKey)
	keys := h.SharedDataLen() // the plugin's own at start (its queue's number)
	h.OnGetSharedData(func(string) ([]byte, uint32, wasmhost.Status, bool) {
		return nil, 0, wasmhost.Status(2), true // BadArgument: the host refuses
	})
	for i := 0; i < 60; i++ {
		if r := send(t, vm, "x-api-key", "f"); r.Status != 200 {
			t.Fatalf("request %d: %d, want 200 (fail open)", i, r.Status)
		}
	}
	if v, _ := h.Metric("tokenbucket.rule.per-key.failed_open"); v != 60 {
		t.Fatalf("failed_open = %d, want 60", v)
	}
	if h.SharedDataLen() != keys {
		t.Fatal("a failed decision wrote shared data")
	}
}

// TestWasmStackAtomic: per-key (burst 5) under a global (burst 12), four
// workers: exactly 12 admitted, and the per-key buckets together lost
// exactly 12 tokens.
func TestWasmStackAtomic(t *testing.T) {
	h := newHost(t)
	cfg := `{"rules": [
	  {"name": "user", "limit_keys": ["header:u"], "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 5}},
	  {"name": "global", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 12}}]}`
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		vm := newVM(t, h, cfg)
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 30; i++ {
				hs := wasmhost.Headers{{":method", "GET"}, {":path", "/"}, {":authority", "a"}, {"u", strconv.Itoa((i + w) % 4)}}
				r, err := vm.HTTP(wasmhost.Request{Headers: hs})
				if err != nil {
					t.Error(err)
					return
				}
				if r.Status == 200 {
					admitted.Add(1)
				}
			}
		}(w)
	}
	wg.Wait()
	if admitted.Load() != 12 {
		t.Fatalf("admitted %d, want 12", admitted.Load())
	}
	// Peek at each user bucket with a configuration holding the user rule
	// alone: an admitted request shows the tokens left after it.
	peek := newVM(t, h, `{"rules": [{"name": "user", "limit_keys": ["header:u"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 0.001, "burst": 5}}]}`)
	used := 0
	for u := 0; u < 4; u++ {
		r := send(t, peek, "u", strconv.Itoa(u))
		left := 0 // a 429 means the bucket was empty
		if r.Status == 200 {
			left, _ = strconv.Atoi(r.Headers.Get("ratelimit-remaining"))
			left++ // the peek itself took one
		}
		used += 5 - left
	}
	if used != 12 {
		t.Fatalf("user buckets lost %d tokens in all, want 12: a rejected request kept a token", used)
	}
}

func TestWasmClusterCallout(t *testing.T) {
	h := newHost(t)
	cfg := `{"service": {"cluster": "limit_service", "timeout_ms": 40},
	  "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`
	vm := newVM(t, h, cfg)
	r := send(t, vm, "k", "v")
	if !r.Paused || len(r.Callouts) != 1 || r.Callouts[0].Cluster != "limit_service" || r.Callouts[0].Timeout != 40*time.Millisecond {
		t.Fatalf("want one paused callout to limit_service with a 40ms timeout, got %+v", r)
	}
	r, err := vm.AnswerCallout(r.Callouts[0].ID, wasmhost.Headers{{":status", "200"}},
		[]byte(`{"allowed":false,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":900,"reset_ms":1800}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != 429 || r.Headers.Get("retry-after") != "1" || r.Headers.Get("ratelimit-policy") != `"fleet";q=2;w=2` {
		t.Fatalf("cluster rejection: %d %v", r.Status, r.Headers)
	}
	r = send(t, vm, "k", "v")
	if r, err = vm.FailCallout(r.Callouts[0].ID); err != nil || r.Status != 200 {
		t.Fatalf("failed callout with failure_mode allow: %d %v", r.Status, err)
	}
}

// TestWasmMemoryCollectedOnTicks: with collection moved to the 1 s tick, a
// worker answering 1000 rejections a second (the path that allocates most,
// about 900 bytes a request) for 30 seconds collects on its ticks and stays
// within a few MiB.
func TestWasmMemoryCollectedOnTicks(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, `{"rules": [{"name": "one", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 1, "burst": 1}}]}`)
	var maxHeap, maxSys int64
	for second := 0; second < 30; second++ {
		for i := 0; i < 1000; i++ {
			h.Advance(time.Millisecond)
			send(t, vm, "x-api-key", "k")
		}
		if err := vm.Tick(); err != nil {
			t.Fatal(err)
		}
		heap, _ := h.Metric("tokenbucket.memory.heap_bytes")
		sys, _ := h.Metric("tokenbucket.memory.sys_bytes")
		maxHeap, maxSys = max(maxHeap, heap), max(maxSys, sys)
	}
	gcs, _ := h.Metric("tokenbucket.memory.gc_cycles")
	rejected, _ := h.Metric("tokenbucket.rule.one.rejected")
	t.Logf("30000 requests (%d rejected): heap at most %d bytes, sys at most %d bytes, %d collections", rejected, maxHeap, maxSys, gcs)
	if rejected < 29000 || gcs == 0 || maxHeap > 16<<20 || maxSys > 32<<20 {
		t.Errorf("rejected %d, gc_cycles %d, heap %d, sys %d: want >= 29000 rejected, collections, heap <= 16 MiB, sys <= 32 MiB", rejected, gcs, maxHeap, maxSys)
	}
}

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

// TestWasmRefillOutlivesItsRequest: a lease refill is the plugin's call,
// sent while a request spends from the lease; the request has ended when
// the answer arrives, and the grant goes into the lease all the same, so
// the next request spends from it without a call. (The SDK files a call's
// answer under the context whose callback sent it and drops it once that
// context is gone: the plugin sends its calls from a plugin-context
// callback, woken through its shared queue.)
func TestWasmRefillOutlivesItsRequest(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, wasmLeased)
	answer := limitdAnswers(t, h, vm)
	first := send(t, vm, "k", "hot") // an empty lease: the request waits for its lease call
	answer(waitedCall(t, vm, first))
	if r := streamState(t, vm, first.StreamID); r.Status != 200 {
		t.Fatalf("first request after its lease call: %d", r.Status)
	}
	second := send(t, vm, "k", "hot") // spends below half the lease: claims a refill
	pending := vm.PendingCallouts()
	if second.Paused || second.Status != 200 || len(pending) != 1 || pending[0].ContextID != vm.RootContextID() {
		t.Fatalf("second request: %d paused %v, pending %+v; want 200 at once and the refill sent by the plugin context (%d)",
			second.Status, second.Paused, pending, vm.RootContextID())
	}
	answer(pending[0]) // the second request has ended
	third := send(t, vm, "k", "hot")
	if third.Paused || third.Status != 200 || len(vm.PendingCallouts()) != 0 {
		t.Fatalf("third request: %d paused %v, pending %+v; want 200 from the refilled lease, no call",
			third.Status, third.Paused, vm.PendingCallouts())
	}
}

// TestWasmLeaseGrantOutlivesAResetRequest: a request waits for its lease
// call and is reset (the client goes away) before the answer; the grant
// goes into the lease all the same, so the next request spends from it
// without a call.
func TestWasmLeaseGrantOutlivesAResetRequest(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, wasmLeased)
	answer := limitdAnswers(t, h, vm)
	first := send(t, vm, "k", "hot")
	if !first.Paused {
		t.Fatalf("first request: %+v, want paused on its lease call", first)
	}
	pending := vm.PendingCallouts()
	if len(pending) != 1 {
		t.Fatalf("pending %+v, want the lease call", pending)
	}
	if _, err := vm.ResetStream(first.StreamID); err != nil {
		t.Fatal(err)
	}
	answer(pending[0])
	second := send(t, vm, "k", "hot")
	if second.Paused || second.Status != 200 || len(vm.PendingCallouts()) != 0 {
		t.Fatalf("next request: %d paused %v, pending %+v; want 200 from the grant the reset request's call brought, no call",
			second.Status, second.Paused, vm.PendingCallouts())
	}
}

// TestWasmRefusedRefill: a refill the plugin sends from its queue's
// callback, which the host refuses, ends as a refused dispatch does: counted
// in service_errors, its claim released, and the next request that finds
// the lease short asks the service itself.
func TestWasmRefusedRefill(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, wasmLeased)
	answer := limitdAnswers(t, h, vm)
	first := send(t, vm, "k", "hot")
	if answer(waitedCall(t, vm, first)); streamState(t, vm, first.StreamID).Status != 200 {
		t.Fatalf("first request: %+v, want paused on its lease call, then 200", streamState(t, vm, first.StreamID))
	}
	h.OnHTTPCall(func(string) wasmhost.Status { return wasmhost.StatusBadArgument })
	if r := send(t, vm, "k", "hot"); r.Paused || r.Status != 200 {
		t.Fatalf("second request (claims the refill): %d paused %v, want 200", r.Status, r.Paused)
	}
	h.OnHTTPCall(nil)
	if n, _ := h.Metric("tokenbucket.service_errors"); n != 1 || len(vm.PendingCallouts()) != 0 {
		t.Fatalf("service_errors %d, pending %+v; want the refused refill counted once, nothing pending", n, vm.PendingCallouts())
	}
	third := send(t, vm, "k", "hot") // half a token left: short
	c := waitedCall(t, vm, third)
	if !strings.Contains(string(c.Body), `"want":2`) {
		t.Fatalf("third request's lease call %s: want the lease's size (the refused refill's claim released)", c.Body)
	}
	if answer(c); streamState(t, vm, third.StreamID).Status != 200 {
		t.Fatalf("third request after its lease call: %+v", streamState(t, vm, third.StreamID))
	}
	if n, _ := h.Metric("tokenbucket.rule.fleet.failed_open"); n != 0 {
		t.Fatalf("failed_open %d, want 0", n)
	}
}

// waitedCall returns the lease call request r waits for: the plugin
// context's one pending call (a request's lease call is the plugin's, so
// that its grant lands whatever becomes of the request).
func waitedCall(t *testing.T, vm *wasmhost.VM, r wasmhost.Response) wasmhost.Callout {
	t.Helper()
	pending := vm.PendingCallouts()
	if !r.Paused || len(r.Callouts) != 0 || len(pending) != 1 || pending[0].ContextID != vm.RootContextID() {
		t.Fatalf("request %+v, pending %+v: want it paused on one lease call of the plugin context (%d)", r, pending, vm.RootContextID())
	}
	return pending[0]
}

// streamState is the state of stream id (in flight or ended).
func streamState(t *testing.T, vm *wasmhost.VM, id uint32) wasmhost.Response {
	t.Helper()
	r, ok := vm.Stream(id)
	if !ok {
		t.Fatalf("stream %d: unknown", id)
	}
	return r
}

// limitdAnswers returns a function that answers a callout of vm with a real
// limit service (package service on a memory store, on h's clock).
func limitdAnswers(t *testing.T, h *wasmhost.Host, vm *wasmhost.VM) func(wasmhost.Callout) wasmhost.Response {
	srv, err := service.NewServer(service.Config{Store: service.NewMemoryStore(service.MemoryOptions{
		Now: func() int64 { return h.Now().UnixNano() }})})
	if err != nil {
		t.Fatal(err)
	}
	return func(c wasmhost.Callout) wasmhost.Response {
		t.Helper()
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest(c.Headers.Get(":method"), c.Headers.Get(":path"), bytes.NewReader(c.Body)))
		r, err := vm.AnswerCallout(c.ID, wasmhost.Headers{{":status", strconv.Itoa(w.Code)}}, w.Body.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
}

// wasmLeased is one leased cluster rule.
const wasmLeased = `{"service": {"cluster": "limitd", "timeout_ms": 30},
 "rules": [{"name": "fleet", "scope": "cluster", "sync": "lease", "limit_keys": ["header:k"],
   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 40}}]}`

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

// wasmCluster is one cluster rule with failure_mode deny and a short timeout.
const wasmCluster = `{"service": {"cluster": "limit_service", "timeout_ms": 40, "failure_mode": "deny"},
  "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:k"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`
