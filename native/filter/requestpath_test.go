package filter

import (
	"runtime"
	"testing"
	"time"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/requestpath"
)

// The configurations of the measured requests: one local rule keyed by a
// header, allowed (oneRule) or refused (oneToken: a burst of one, which
// the key's first request spends).
const (
	oneRule = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 20}}]}`
	oneToken = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}}]}`
)

// replyHandle is a filterHandle that keeps the status of the local reply
// sent on it (0 while none), and whose scheduler runs nothing (a paused
// request takes it; an answered one needs none).
type replyHandle struct {
	*filterHandle
	status uint32
}

func (h *replyHandle) SendLocalResponse(status uint32, _ [][2]string, _ []byte, _ string) {
	h.status = status
}

func (h *replyHandle) GetScheduler() shared.Scheduler { return h }
func (h *replyHandle) Schedule(func())                {}

// nativeRequest creates a configuration cfg, sends a key's first request,
// and returns the second one's filter and handle, the configuration's
// ticker stopped.
func nativeRequest(t *testing.T, cfg string) (*httpFilter, *replyHandle) {
	t.Helper()
	// The P a worker's thread yields now and then (keepP) would let other
	// goroutines run inside the measured request: not its path.
	t.Cleanup(swapPClock(monotonic, func() {}))
	goroutines := runtime.NumGoroutine()
	_, c := newConfig(t, cfg)
	first := &replyHandle{filterHandle: &filterHandle{req: newHeaders(map[string][]string{":path": {"/"}, "x-api-key": {"a"}}), resp: newHeaders(nil)}}
	c.Create(first).OnRequestHeaders(first.req, false) // the key's first request
	h := &replyHandle{filterHandle: &filterHandle{req: newHeaders(map[string][]string{":path": {"/"}, "x-api-key": {"a"}}), resp: newHeaders(nil)}}
	f := c.Create(h).(*httpFilter)
	// No tick while the request is measured, and no code of the ticker's
	// goroutine, which runs when the scheduler lets it: the ticker is
	// stopped and gone before (a request does not need it).
	c.OnDestroy()
	for deadline := time.Now().Add(time.Minute); runtime.NumGoroutine() > goroutines; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("the configuration's ticker is still running a minute after OnDestroy")
		}
	}
	return f, h
}

// TestRequestPathNative: what one allowed request runs through in the
// native module (a key's second), from OnRequestHeaders to its Continue
// (the Wasm plugin's is internal/testing/requestpath's TestRequestPathWasm).
func TestRequestPathNative(t *testing.T) {
	f, h := nativeRequest(t, oneRule)
	p := requestpath.Measure(t, func() {
		if st := f.OnRequestHeaders(h.req, false); st != shared.HeadersStatusContinue {
			t.Errorf("the request was not allowed: %v", st)
		}
	})
	t.Logf("one allowed request on the native module: %v", p)
	p.Within(t, requestpath.Ceiling{Files: 17, Calls: 14, Hops: 6})
}

// TestRequestPathNativeRefused: what one refused request runs through in
// the native module (a key's second, its one token spent), from
// OnRequestHeaders to its local reply, a 429.
func TestRequestPathNativeRefused(t *testing.T) {
	f, h := nativeRequest(t, oneToken)
	e := f.w.e
	p := requestpath.Measure(t, func() {
		f.OnRequestHeaders(h.req, false)
		if h.status != 429 {
			t.Errorf("the request was not refused: local reply %d", h.status)
		}
		if f.w.e != e {
			t.Errorf("the worker's engine was replaced: a panic on the request's path")
		}
	})
	t.Logf("one refused request on the native module: %v", p)
	p.Within(t, requestpath.Ceiling{Files: 19, Calls: 12, Hops: 6})
}

// TestRequestPathNativeWhole: the same request from its request headers to
// its end: its response's headers (the rate-limit headers added), the
// stream's completion and the filter's destruction.
func TestRequestPathNativeWhole(t *testing.T) {
	f, h := nativeRequest(t, oneRule)
	p := requestpath.Measure(t, func() {
		if st := f.OnRequestHeaders(h.req, false); st != shared.HeadersStatusContinue {
			t.Errorf("the request was not allowed: %v", st)
		}
		f.OnResponseHeaders(h.resp, true)
		f.OnStreamComplete()
		f.OnDestroy()
	})
	t.Logf("one allowed request on the native module, to its end: %v", p)
	p.Within(t, requestpath.Ceiling{Files: 19, Calls: 18, Hops: 6})
}
