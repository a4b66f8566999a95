package plugin

import (
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

const ms = int64(1e6)

const smoothCfg = `{"rules": [{"name": "smooth", "limit_keys": ["header:k"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 10, "burst": 1, "max_delay_ms": 1000}}]}`

// TestHoldTicksFastOnlyWhileHeld: the plugin's tick stays at one second
// while nothing is held (an idle plugin pays nothing for holding), drops to
// fastTickMS when a request is held, resumes it on the first tick at or
// after its moment (never before), and goes back to one second once
// nothing is held.
func TestHoldTicksFastOnlyWhileHeld(t *testing.T) {
	e := start(t, smoothCfg)
	if p := e.host.GetTickPeriod(); p != slowTickMS {
		t.Fatalf("tick period %d ms at start, want %d", p, slowTickMS)
	}
	if r := e.do("k", "a"); r.status != 200 {
		t.Fatalf("first request: %d", r.status)
	}
	for range 3 {
		e.host.Tick()
	}
	if p := e.host.GetTickPeriod(); p != slowTickMS {
		t.Fatalf("tick period %d ms with nothing held, want %d", p, slowTickMS)
	}
	t0 := e.clk.t
	id := e.host.InitializeHttpContext()
	if a := e.host.CallOnRequestHeaders(id, requestHeaders([]string{"k", "a"}), false); a != types.ActionPause || e.host.GetSentLocalResponse(id) != nil {
		t.Fatalf("second request: action %v, local reply %v; want held", a, e.host.GetSentLocalResponse(id))
	}
	if p := e.host.GetTickPeriod(); p != fastTickMS {
		t.Fatalf("tick period %d ms while a request is held, want %d", p, fastTickMS)
	}
	e.clk.t = t0 + 99*ms
	e.host.Tick()
	if a := e.host.GetCurrentHttpStreamAction(id); a != types.ActionPause {
		t.Fatalf("resumed 1 ms before its moment (action %v)", a)
	}
	e.clk.t = t0 + 100*ms
	e.host.Tick()
	if a := e.host.GetCurrentHttpStreamAction(id); a != types.ActionContinue {
		t.Fatalf("not resumed at its moment (action %v)", a)
	}
	if p := e.host.GetTickPeriod(); p != slowTickMS {
		t.Fatalf("tick period %d ms once nothing is held, want %d", p, slowTickMS)
	}
	e.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	found := false
	for _, h := range e.host.GetCurrentResponseHeaders(id) {
		if h[0] == "x-ratelimit-delayed-ms" && h[1] == "100" {
			found = true
		}
	}
	if !found {
		t.Fatalf("response headers %v, want x-ratelimit-delayed-ms: 100", e.host.GetCurrentResponseHeaders(id))
	}
	e.host.CompleteHttpContext(id)
	if e.counter("rule.smooth.delayed") != 1 {
		t.Fatalf("delayed %d, want 1", e.counter("rule.smooth.delayed"))
	}
}

// TestHoldAbandoned: a held request whose stream ends gives its tokens
// back once, its hold never runs, and the tick slows down after its moment.
func TestHoldAbandoned(t *testing.T) {
	e := start(t, smoothCfg)
	e.do("k", "a")
	t0 := e.clk.t
	id := e.host.InitializeHttpContext()
	e.host.CallOnRequestHeaders(id, requestHeaders([]string{"k", "a"}), false)
	e.host.CompleteHttpContext(id) // the client went away
	if e.counter("rule.smooth.delay_abandoned") != 1 || e.counter("refunds") != 1 {
		t.Fatalf("abandoned %d, refunds %d; want 1, 1", e.counter("rule.smooth.delay_abandoned"), e.counter("refunds"))
	}
	e.clk.t = t0 + 200*ms
	e.host.Tick()
	if e.counter("rule.smooth.delayed") != 0 {
		t.Fatal("an abandoned request's hold ran")
	}
	if p := e.host.GetTickPeriod(); p != slowTickMS {
		t.Fatalf("tick period %d ms after the last hold's moment, want %d", p, slowTickMS)
	}
}

// TestHoldsCompact: the holds of requests that ended leave the heap once it
// grows, not only at their moments.
func TestHoldsCompact(t *testing.T) {
	var hs holds
	hs.fast = true // no host call
	live := &httpContext{id: 7}
	for i := range 1000 {
		c := &httpContext{id: uint32(100 + i)}
		hs.h = append(hs.h, hold{due: int64(i), c: c, gen: c.gen})
		c.gen++ // the request ended
	}
	if err := hs.add(5000, live, func() {}); err != nil {
		t.Fatal(err)
	}
	if len(hs.h) != 1 || hs.h[0].c != live {
		t.Fatalf("%d holds after compacting, want the one live", len(hs.h))
	}
}
