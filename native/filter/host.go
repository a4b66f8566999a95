package filter

import (
	"time"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// host is engine.Host for one worker's Plugin (w), or, with defining, for
// the Plugin that checks a configuration and defines its metrics on the
// main thread.
type host struct {
	c        *filterConfig
	w        *worker
	defining bool
}

// Now is the wall clock, the same for every worker.
func (h *host) Now() int64 { return time.Now().UnixNano() }

func (h *host) SharedData() engine.SharedData { return h.c.store }

func (h *host) Counter(name string) engine.Counter {
	return counter{ms: h.c.metrics, m: h.metric(name, false)}
}

func (h *host) Gauge(name string) engine.Gauge {
	return gauge{ms: h.c.metrics, m: h.metric(name, true)}
}

func (h *host) metric(name string, gauge bool) *metric {
	if h.defining {
		return h.c.metrics.define(h.c.handle, name, gauge)
	}
	return h.c.metrics.lookup(name)
}

func (h *host) Log(level engine.LogLevel, msg string) { h.c.log(level, msg) }

// Callout sends a call the Plugin owns from Envoy's main thread, through
// the configuration's handle: it is dispatched in a function handed to the
// configuration's scheduler, and its answer, delivered on the main thread,
// is given to the engine under the worker's lock. A call Envoy refuses to
// start is answered as failed, as a call that got no answer.
func (h *host) Callout(call *engine.Call, answer func(*engine.Answer)) error {
	c, w := h.c, h.w
	return c.schedule(func() {
		a := &mainAnswer{c: c, w: w, answer: answer, maxBody: call.MaxBody}
		if res, _ := c.handle.HttpCallout(call.Cluster, call.Headers, call.Body, uint64(call.TimeoutMS), a); res != shared.HttpCalloutInitSuccess {
			a.deliver(&engine.Answer{Failed: true})
		}
	})
}

// mainAnswer delivers the answer of a call the Plugin owns.
type mainAnswer struct {
	c       *filterConfig
	w       *worker
	answer  func(*engine.Answer)
	maxBody int
}

// OnHttpCalloutDone implements shared.HttpCalloutCallback (main thread).
func (a *mainAnswer) OnHttpCalloutDone(_ uint64, result shared.HttpCalloutResult, headers [][2]shared.UnsafeEnvoyBuffer, body []shared.UnsafeEnvoyBuffer) {
	a.deliver(readAnswer(result, headers, body, a.maxBody))
}

func (a *mainAnswer) deliver(ans *engine.Answer) {
	if a.w == nil {
		return
	}
	a.w.enterMain()
	defer a.w.exitMain()
	defer a.c.recoverMain("the answer of a call", a.w)
	a.answer(ans)
}

// readAnswer copies a callout's answer out of Envoy's buffers.
func readAnswer(result shared.HttpCalloutResult, headers [][2]shared.UnsafeEnvoyBuffer, body []shared.UnsafeEnvoyBuffer, maxBody int) *engine.Answer {
	a := &engine.Answer{}
	switch result {
	case shared.HttpCalloutSuccess:
	case shared.HttpCalloutExceedResponseBufferLimit:
		a.TooLarge = true
		return a
	default: // reset, timeout, no healthy upstream
		a.Failed = true
		return a
	}
	for _, h := range headers {
		if h[0].ToUnsafeString() == ":status" {
			a.Status = h[1].ToString()
		}
	}
	size := 0
	for _, b := range body {
		size += int(b.Len)
	}
	if size > maxBody {
		a.TooLarge = true
		return a
	}
	a.Body = make([]byte, 0, size)
	for _, b := range body {
		a.Body = append(a.Body, b.ToUnsafeBytes()...)
	}
	return a
}
