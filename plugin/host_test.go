package plugin

import (
	"errors"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// TestWaitingCallsBounded: calls the plugin owns that wait for the plugin
// context are bounded; the next is refused (the engine counts it as a
// refused dispatch), and the plugin context's next callback sends those
// that wait, in order.
func TestWaitingCallsBounded(t *testing.T) {
	e := start(t, perKey)
	h := &host{id: proxytest.PluginContextID, now: e.clk.now, sd: sharedData{}} // no queue: nothing wakes it
	defer func(a uint32) { active = a }(active)
	active = h.id + 1 // a request's callback
	for i := range maxWaitingCalls {
		if err := h.Callout(call("/"+string(rune('a'+i%26))), func(*engine.Answer) {}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if err := h.Callout(call("/over"), func(*engine.Answer) {}); !errors.Is(err, errTooManyWaiting) {
		t.Fatalf("call %d: %v, want %v", maxWaitingCalls+1, err, errTooManyWaiting)
	}
	before := len(e.host.GetCalloutAttributesFromContext(proxytest.PluginContextID))
	if before != 0 {
		t.Fatalf("%d calls sent from a request's callback", before)
	}
	active = h.id // the plugin context's callback (its tick)
	h.sendWaiting()
	sent := e.host.GetCalloutAttributesFromContext(proxytest.PluginContextID)
	if len(sent) != maxWaitingCalls || len(h.waiting) != 0 {
		t.Fatalf("%d calls sent, %d still waiting; want %d and none", len(sent), len(h.waiting), maxWaitingCalls)
	}
	for i, c := range sent {
		if want := "/" + string(rune('a'+i%26)); c.Headers[1][1] != want {
			t.Fatalf("call %d sent to %s, want %s (in order)", i, c.Headers[1][1], want)
		}
	}
	if err := h.Callout(call("/again"), func(*engine.Answer) {}); err != nil {
		t.Fatalf("a call from the plugin context's callback: %v", err)
	}
	if n := len(e.host.GetCalloutAttributesFromContext(proxytest.PluginContextID)); n != maxWaitingCalls+1 {
		t.Fatalf("%d calls sent, want the one made in the plugin context's callback sent at once", n)
	}
}

// TestLostWakeUpHealsAtTick: a wake-up the host accepted but never
// delivered holds the calls that wait until the tick, which sends them;
// the next call then wakes the plugin context again.
func TestLostWakeUpHealsAtTick(t *testing.T) {
	e := start(t, perKey)
	q, err := proxywasm.RegisterSharedQueue("lost")
	if err != nil {
		t.Fatal(err)
	}
	h := &host{id: proxytest.PluginContextID, now: e.clk.now, sd: sharedData{}, queue: q, hasQueue: true,
		woken: true} // a wake-up the host lost
	defer func(a uint32) { active = a }(active)
	active = h.id + 1 // a request's callback
	if err := h.Callout(call("/a"), func(*engine.Answer) {}); err != nil {
		t.Fatal(err)
	}
	if n := e.host.GetQueueSize(q); n != 0 || len(h.waiting) != 1 {
		t.Fatalf("queue %d, waiting %d; want the call waiting for the wake-up thought to be coming", n, len(h.waiting))
	}
	active = h.id
	h.onTick()
	if n := len(e.host.GetCalloutAttributesFromContext(proxytest.PluginContextID)); n != 1 || len(h.waiting) != 0 {
		t.Fatalf("after the tick: %d sent, %d waiting; want 1 and none", n, len(h.waiting))
	}
	active = h.id + 1
	if err := h.Callout(call("/b"), func(*engine.Answer) {}); err != nil {
		t.Fatal(err)
	}
	if n := e.host.GetQueueSize(q); n != 1 {
		t.Fatalf("queue %d after the next call, want its wake-up enqueued", n)
	}
}

// call is a limit-service call for these tests.
func call(path string) *engine.Call {
	return &engine.Call{Cluster: "limit_service", MaxBody: 100,
		Headers: [][2]string{{":method", "POST"}, {":path", path}, {":authority", "limitd"}}}
}

// TestCallAnswers: what Envoy delivers for a call is the engine's Answer:
// no headers is a failed call (reset, timeout, no cluster); then the
// :status, and the body up to the call's MaxBody, a larger one TooLarge
// and unread.
func TestCallAnswers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers [][2]string
		body    string
		want    engine.Answer
	}{
		{"failed", nil, "", engine.Answer{Failed: true}},
		{"a status", [][2]string{{":status", "503"}}, "oops", engine.Answer{Status: "503", Body: []byte("oops")}},
		{"a body of MaxBody", [][2]string{{":status", "200"}}, strings.Repeat("x", 100), engine.Answer{Status: "200", Body: []byte(strings.Repeat("x", 100))}},
		{"a body past MaxBody", [][2]string{{":status", "200"}}, strings.Repeat("x", 101), engine.Answer{Status: "200", TooLarge: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, perKey)
			h := &host{id: proxytest.PluginContextID, now: e.clk.now, sd: sharedData{}}
			defer func(a uint32) { active = a }(active)
			active = h.id
			var got *engine.Answer
			if err := h.Callout(call("/v1/decide"), func(a *engine.Answer) { got = a }); err != nil {
				t.Fatal(err)
			}
			sent := e.host.GetCalloutAttributesFromContext(proxytest.PluginContextID)
			if len(sent) != 1 || sent[0].Upstream != "limit_service" {
				t.Fatalf("calls sent %+v, want one to limit_service", sent)
			}
			e.host.CallOnHttpCallResponse(sent[0].CalloutID, tc.headers, nil, []byte(tc.body))
			if got == nil || got.Failed != tc.want.Failed || got.Status != tc.want.Status || got.TooLarge != tc.want.TooLarge ||
				string(got.Body) != string(tc.want.Body) || got.Err != nil {
				t.Fatalf("answer %+v, want %+v", got, tc.want)
			}
		})
	}
}
