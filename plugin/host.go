package plugin

import (
	"errors"
	"strconv"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// sharedData is engine.SharedData on the host's shared data.
type sharedData struct{}

func (sharedData) Get(key string) ([]byte, uint32, error) {
	v, cas, err := proxywasm.GetSharedData(key)
	if errors.Is(err, types.ErrorStatusNotFound) {
		return nil, 0, engine.ErrNotFound
	}
	return v, cas, err
}

func (sharedData) Set(key string, value []byte, cas uint32) error {
	err := proxywasm.SetSharedData(key, value, cas)
	if errors.Is(err, types.ErrorStatusCasMismatch) {
		return engine.ErrCASMismatch
	}
	return err
}

// active is the context whose callback runs: a plugin context's (its
// tick, its queue, the answer to a call it owns) or a request's, or the
// request a plugin context's callback acts on (stream.Run).
var active uint32

// lent is set while a plugin context's callback acts on a request
// (stream.Run): the SDK files a call dispatched then under the plugin
// context, so its answer must make the request's context effective again.
var lent bool

// host is engine.Host on proxy-wasm, for one plugin context.
//
// # Calls the plugin owns
//
// The SDK files a call's answer under the context whose callback sent it,
// and drops the answer once that context is gone. A call the plugin owns
// (a lease refill or return, a charge, a shadow-only call) must have its
// answer whatever becomes of the request that caused it, so it is always
// sent from a callback of the plugin context: at once when the plugin
// context's callback runs (a tick, the answer to another plugin call);
// otherwise it waits in the plugin context (at most maxWaitingCalls; the
// next is refused, as a call the host refuses) and the plugin context is
// woken through a shared queue of its own (proxy_on_queue_ready, which
// Envoy posts to the worker's event loop: it runs once the request's
// callback has returned, before the worker's next event). Each tick sends
// what still waits, so a host without queues sends calls a tick late.
//
// Envoy keys a shared queue by vm_id and name, the last registration
// winning, and every worker runs its own VM with the same vm_id: each
// plugin context registers a name of its own, numbered by a counter in
// shared data (engine.DrawNumber).
type host struct {
	id  uint32
	now func() int64
	sd  engine.SharedData

	queue    uint32 // the plugin context's shared queue, if hasQueue
	hasQueue bool
	woken    bool          // a wake-up is in the queue, not yet handled
	waiting  []waitingCall // calls to send from the plugin context
}

// waitingCall is a call the plugin owns, waiting for the plugin context.
type waitingCall struct {
	call   *engine.Call
	answer func(*engine.Answer)
}

const (
	// maxWaitingCalls bounds the calls that wait for the plugin context
	// between two of its callbacks.
	maxWaitingCalls = 1024
	// queueCounterKey numbers the plugin contexts' shared queues.
	queueCounterKey = Name + ":queues"
)

// wakeUp is what a wake-up enqueues: one byte (its content is not read).
var wakeUp = []byte{1}

// errTooManyWaiting refuses a call when maxWaitingCalls already wait.
var errTooManyWaiting = errors.New("plugin: " + strconv.Itoa(maxWaitingCalls) + " calls already wait for the plugin context")

func (h *host) Now() int64                         { return h.now() }
func (h *host) SharedData() engine.SharedData      { return h.sd }
func (h *host) Counter(name string) engine.Counter { return defineCounter(name) }
func (h *host) Gauge(name string) engine.Gauge     { return defineGauge(name) }

func (h *host) Log(level engine.LogLevel, msg string) {
	switch level {
	case engine.LogCritical:
		proxywasm.LogCritical(msg)
	case engine.LogWarn:
		proxywasm.LogWarn(msg)
	default:
		proxywasm.LogInfo(msg)
	}
}

// registerQueue registers the plugin context's shared queue (see host). It
// runs in OnPluginStart.
func (h *host) registerQueue() error {
	n, err := engine.DrawNumber(h.sd, queueCounterKey)
	if err != nil {
		return err
	}
	id, err := proxywasm.RegisterSharedQueue(Name + ".calls." + strconv.FormatUint(n, 10))
	if err != nil {
		return err
	}
	h.queue, h.hasQueue = id, true
	return nil
}

// Callout sends call as the plugin context's (see host): at once in a
// callback of the plugin context, otherwise once the plugin context is
// woken. A call sent later whose dispatch fails gets a failed answer.
func (h *host) Callout(call *engine.Call, answer func(*engine.Answer)) error {
	if active == h.id {
		return dispatch(call, h.id, answer)
	}
	if len(h.waiting) >= maxWaitingCalls {
		return errTooManyWaiting
	}
	h.waiting = append(h.waiting, waitingCall{call: call, answer: answer})
	h.wake()
	return nil
}

// wake asks the host for a callback of the plugin context (OnQueueReady),
// unless one is coming. A wake-up the host refuses is tried again by the
// next call; meanwhile the tick sends the calls.
func (h *host) wake() {
	if !h.hasQueue || h.woken {
		return
	}
	from := active
	h.woken = true
	if err := proxywasm.EnqueueSharedQueue(h.queue, wakeUp); err != nil {
		h.woken = false
		return
	}
	if active != from {
		// The host ran OnQueueReady within the enqueue (the SDK's
		// emulator does; Envoy posts it): back to the request.
		active = from
		if err := proxywasm.SetEffectiveContext(from); err != nil {
			proxywasm.LogWarn(Name + ": back to the request's context: " + err.Error())
		}
	}
}

// onQueueReady empties the plugin context's queue and sends the calls
// that wait. It runs in the plugin context's callback.
func (h *host) onQueueReady(queueID uint32) {
	if !h.hasQueue || queueID != h.queue {
		return
	}
	h.woken = false
	// One wake-up per woken period is enqueued; the bound only keeps a
	// host that answers nonsense from holding the callback.
	for range maxWaitingCalls {
		if _, err := proxywasm.DequeueSharedQueue(queueID); err != nil {
			break
		}
	}
	h.sendWaiting()
}

// onTick sends the calls that still wait. A wake-up the host accepted but
// never delivered would otherwise hold every later call until a tick: the
// next call enqueues a fresh one (a late one then finds nothing to send).
func (h *host) onTick() {
	h.woken = false
	h.sendWaiting()
}

// sendWaiting sends the calls that wait, in order. It runs in a callback
// of the plugin context. A call whose dispatch fails gets a failed answer
// (engine.Answer.Failed) at once: the engine then does what it does when a
// dispatch is refused (counts the failure, releases what the call
// claimed), as no request waits for a call the plugin owns.
func (h *host) sendWaiting() {
	for i := 0; i < len(h.waiting); i++ {
		w := h.waiting[i]
		h.waiting[i] = waitingCall{}
		if err := dispatch(w.call, h.id, w.answer); err != nil {
			w.answer(&engine.Answer{Failed: true})
		}
	}
	h.waiting = h.waiting[:0]
}

// dispatch sends call and delivers its answer in context owner. Envoy
// refuses a call with BadArgument when the cluster does not exist (or the
// call lacks :method, :path or :authority, which the engine always sends):
// the error says so.
func dispatch(call *engine.Call, owner uint32, answer func(*engine.Answer)) error {
	_, err := proxywasm.DispatchHttpCall(call.Cluster, call.Headers, call.Body, nil, call.TimeoutMS,
		func(numHeaders, bodySize, _ int) {
			active = owner
			answer(readAnswer(numHeaders, bodySize, call.MaxBody))
		})
	if errors.Is(err, types.ErrorStatusBadArgument) {
		return errors.New("no cluster " + strconv.Quote(call.Cluster) + " in Envoy")
	}
	return err
}

// dispatchLent is dispatch for a request's call sent while a plugin
// context's callback acts on the request (lent): the SDK delivers the
// answer in the plugin context, so the request's context is made
// effective first, and the answer is dropped when the host no longer has
// it.
func dispatchLent(call *engine.Call, owner uint32, answer func(*engine.Answer)) error {
	return dispatch(call, owner, func(a *engine.Answer) {
		if err := proxywasm.SetEffectiveContext(owner); err != nil {
			return
		}
		answer(a)
	})
}

// readAnswer reads a callout's answer from the host.
func readAnswer(numHeaders, bodySize, maxBody int) *engine.Answer {
	a := &engine.Answer{}
	if numHeaders == 0 { // Envoy's sign of a failed call: reset, timeout, no cluster
		a.Failed = true
		return a
	}
	if hs, err := proxywasm.GetHttpCallResponseHeaders(); err == nil {
		for _, h := range hs {
			if h[0] == ":status" {
				a.Status = h[1]
			}
		}
	}
	if bodySize > maxBody {
		a.TooLarge = true
		return a
	}
	a.Body, a.Err = proxywasm.GetHttpCallResponseBody(0, bodySize)
	return a
}

// stream is engine.Stream on proxy-wasm for one HTTP context: the SDK's
// calls act on the context whose callback runs, which is c's while the
// engine calls them.
type stream struct{ c *httpContext }

func (stream) RequestHeader(name string) (string, bool) {
	v, err := proxywasm.GetHttpRequestHeader(name)
	return v, err == nil
}

func (stream) RequestHeaders() [][2]string {
	hs, _ := proxywasm.GetHttpRequestHeaders()
	return hs
}

func (stream) Property(path ...string) ([]byte, bool) {
	v, err := proxywasm.GetProperty(path)
	return v, err == nil
}

func (stream) ReplaceRequestHeader(name, value string) error {
	return proxywasm.ReplaceHttpRequestHeader(name, value)
}

func (stream) ResponseHeader(name string) (string, bool) {
	v, err := proxywasm.GetHttpResponseHeader(name)
	return v, err == nil
}

// AddResponseHeader lends value to the host (see hostString).
func (stream) AddResponseHeader(name, value string) error {
	return proxywasm.AddHttpResponseHeader(name, hostString(value))
}

func (stream) ResponseBody(offset, size int) ([]byte, error) {
	b, err := proxywasm.GetHttpResponseBody(offset, size)
	readBody(len(b))
	return b, err
}

// RequestBody reads from the bytes of the request body new in this
// callback (httpContext.reqBase).
func (s stream) RequestBody(offset, size int) ([]byte, error) {
	b, err := proxywasm.GetHttpRequestBody(s.c.reqBase+offset, size)
	readBody(len(b))
	return b, err
}

func (stream) SendReply(status int, headers [][2]string, body []byte) error {
	return proxywasm.SendHttpResponse(uint32(status), headers, body, -1)
}

func (stream) Resume() error { return proxywasm.ResumeHttpRequest() }

// Callout sends call as the request's own: its answer is dropped once the
// request is done. The SDK drops it once the host deleted the context; the
// context's generation drops it from the request's end on (the SDK ends a
// stream at proxy_on_log, before proxy_on_delete, and the context may
// serve another request by then: see OnHttpStreamDone).
func (s stream) Callout(call *engine.Call, answer func(*engine.Answer)) error {
	c, gen := s.c, s.c.gen
	send := dispatch
	if lent {
		send = dispatchLent
	}
	return send(call, c.id, func(a *engine.Answer) {
		if c.gen == gen {
			answer(a)
		}
	})
}

// After holds the request until delay ns from now: the plugin context's
// tick runs f once it is due (timers.go).
func (s stream) After(delay int64, f func()) error {
	c := s.c
	if c.id == 0 {
		return errStreamDone
	}
	return c.plugin.holds.add(c.plugin.host.now()+delay, c, f)
}

// errStreamDone refuses Run for a context whose request is done.
var errStreamDone = errors.New(Name + ": the request is done")

// Run runs f acting on the request: at once in the request's callback;
// from a plugin context's callback (the answer to a call the plugin owns)
// by making the request's context effective for f (proxy_set_effective_
// context, which the host refuses once the context is gone), then the
// plugin context's again.
func (s stream) Run(f func()) error {
	c := s.c
	if active == c.id {
		f()
		return nil
	}
	if c.id == 0 {
		return errStreamDone
	}
	from, wasLent := active, lent
	if err := proxywasm.SetEffectiveContext(c.id); err != nil {
		return err
	}
	active, lent = c.id, true
	f()
	active, lent = from, wasLent
	if err := proxywasm.SetEffectiveContext(from); err != nil {
		proxywasm.LogWarn(Name + ": back to the plugin context: " + err.Error())
	}
	return nil
}
