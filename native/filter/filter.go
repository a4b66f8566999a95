package filter

import (
	"errors"
	"strconv"
	"time"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// httpFilter hands one stream's callbacks to its engine.Request, under its
// worker's lock, and is the engine.Stream of that request. Envoy calls it
// on the worker's thread only. It is reused for a later stream of the same
// worker once Envoy destroys it.
type httpFilter struct {
	c      *filterConfig
	w      *worker
	handle shared.HttpFilterHandle
	e      engine.App // the app r belongs to
	r      engine.Handler
	// body is the body chunk of the OnResponseBody (or OnRequestBody) in
	// progress, and chunks its slices, read once per callback
	// (ResponseBody, RequestBody).
	body   shared.BodyBuffer
	chunks []shared.UnsafeEnvoyBuffer
	// piece is ResponseBody's buffer for a piece across two slices.
	piece []byte
	// paused: the request waits for the engine (OnRequestHeaders paused it,
	// and it was neither resumed nor answered): a panic resumes it.
	paused bool
	// sched runs work on the stream's thread (Run), taken while the
	// request is paused (Envoy hands it out only in a stream callback).
	sched shared.Scheduler
	// holdGen numbers the filter's holds (After); a hold whose number is
	// no longer current (the stream ended, or held again) runs nothing.
	// timer is the current hold's.
	holdGen uint64
	timer   *time.Timer
}

// enter takes the worker for a callback.
func (f *httpFilter) enter() hold { return f.w.enter() }

// recover recovers a panic in a filter callback: counted, logged, the
// request fails open (a paused one is resumed, a callback returns
// Continue), and the worker's engine, whose state is unknown, replaced.
// It runs with the worker held.
func (f *httpFilter) recover(where string) {
	r := recover()
	if r == nil {
		return
	}
	c := f.c
	c.metrics.add(c.panics, 1)
	c.log(engine.LogCritical, Name+": panic in "+where+", the request goes on (counted in "+Name+".panics): "+panicText(r))
	if f.e == f.w.e {
		c.replaceEngine(f.w)
	}
	f.e, f.r = nil, nil // never reused: Create gives it a new Request
	if f.paused {
		f.paused = false
		f.handle.ContinueRequest()
	}
}

// OnRequestHeaders implements shared.HttpFilter. When the configuration
// reads request bodies (request_json) and a body follows, the engine is
// told so, and a request it holds stops only its headers: the body's
// callbacks come to the engine, which holds them too (StopAndBuffer)
// until it decides.
func (f *httpFilter) OnRequestHeaders(_ shared.HeaderMap, endOfStream bool) (st shared.HeadersStatus) {
	defer f.w.exit(f.enter())
	defer f.recover("request headers")
	if f.r == nil {
		return shared.HeadersStatusContinue
	}
	withBody := f.c.readsRequestBody && !endOfStream
	var a engine.Action
	if withBody {
		a = f.r.OnRequestHeadersWithBody()
	} else {
		a = f.r.OnRequestHeaders()
	}
	if a == engine.Pause {
		f.paused = true
		if f.sched == nil {
			f.sched = f.handle.GetScheduler()
		}
		if withBody {
			return shared.HeadersStatusStop
		}
		return shared.HeadersStatusStopAllAndWatermark
	}
	return shared.HeadersStatusContinue
}

// OnRequestBody implements shared.HttpFilter: the engine reads it only
// when the configuration reads request bodies.
func (f *httpFilter) OnRequestBody(body shared.BodyBuffer, endOfStream bool) shared.BodyStatus {
	if !f.c.readsRequestBody {
		return shared.BodyStatusContinue
	}
	defer f.w.exit(f.enter())
	defer f.recover("request body")
	if f.r == nil {
		return shared.BodyStatusContinue
	}
	f.body, f.chunks = body, nil
	a := f.r.OnRequestBody(int(body.GetSize()), endOfStream)
	f.body, f.chunks = nil, nil
	if a == engine.Pause {
		return shared.BodyStatusStopAndBuffer
	}
	f.paused = false // decided: the request goes on with its body
	return shared.BodyStatusContinue
}

// OnRequestTrailers implements shared.HttpFilter: trailers end the body.
func (f *httpFilter) OnRequestTrailers(shared.HeaderMap) shared.TrailersStatus {
	if !f.c.readsRequestBody {
		return shared.TrailersStatusContinue
	}
	defer f.w.exit(f.enter())
	defer f.recover("request trailers")
	if f.r != nil && f.r.OnRequestTrailers() == engine.Pause {
		return shared.TrailersStatusStop
	}
	return shared.TrailersStatusContinue
}

// OnResponseHeaders implements shared.HttpFilter.
func (f *httpFilter) OnResponseHeaders(_ shared.HeaderMap, endOfStream bool) shared.HeadersStatus {
	defer f.w.exit(f.enter())
	defer f.recover("response headers")
	f.paused = false // Envoy answered the request itself (a timeout)
	if f.r != nil {
		f.r.OnResponseHeaders(endOfStream)
	}
	return shared.HeadersStatusContinue
}

// OnResponseBody implements shared.HttpFilter.
func (f *httpFilter) OnResponseBody(body shared.BodyBuffer, endOfStream bool) shared.BodyStatus {
	if !f.c.readsBody {
		return shared.BodyStatusContinue
	}
	defer f.w.exit(f.enter())
	defer f.recover("response body")
	if f.r != nil {
		f.body, f.chunks = body, nil
		f.r.OnResponseBody(int(body.GetSize()), endOfStream)
		f.body, f.chunks = nil, nil
	}
	return shared.BodyStatusContinue
}

// OnResponseTrailers implements shared.HttpFilter.
func (f *httpFilter) OnResponseTrailers(shared.HeaderMap) shared.TrailersStatus {
	if !f.c.readsBody {
		return shared.TrailersStatusContinue
	}
	defer f.w.exit(f.enter())
	defer f.recover("response trailers")
	if f.r != nil {
		f.r.OnResponseTrailers()
	}
	return shared.TrailersStatusContinue
}

// OnStreamComplete implements shared.HttpFilter: the request's life in the
// engine ends (answers of its callouts that come later are dropped by the
// SDK).
func (f *httpFilter) OnStreamComplete() {
	defer f.w.exit(f.enter())
	defer f.recover("stream complete")
	f.paused = false
	f.dropHold()
	if f.r != nil {
		f.r.Done()
	}
}

// OnDestroy implements shared.HttpFilter: the filter waits for reuse.
func (f *httpFilter) OnDestroy() {
	w := f.w
	defer w.exit(w.enter())
	defer f.recover("destroy")
	if f.r != nil {
		f.r.Done() // idempotent: a stream Envoy never completed
	}
	f.dropHold()
	f.handle, f.body, f.paused, f.sched = nil, nil, false, nil
	if len(w.free) < maxFreeFilters {
		w.free = append(w.free, f)
	}
}

// maxFreeFilters bounds the filters a worker keeps for reuse.
const maxFreeFilters = 128

// The engine.Stream methods: called by the engine during a callback, with
// the worker held.

func (f *httpFilter) RequestHeader(name string) (string, bool) {
	return header(f.handle.RequestHeaders(), name)
}

func (f *httpFilter) ResponseHeader(name string) (string, bool) {
	return header(f.handle.ResponseHeaders(), name)
}

// header reads the first value of name, copied (Envoy's buffer changes
// after the callback). An empty value is told from none.
func header(m shared.HeaderMap, name string) (string, bool) {
	if v := m.GetOne(name); v.Len > 0 {
		return v.ToString(), true
	}
	return "", len(m.Get(name)) > 0
}

func (f *httpFilter) RequestHeaders() [][2]string {
	all := f.handle.RequestHeaders().GetAll()
	hs := make([][2]string, len(all))
	for i, h := range all {
		hs[i] = [2]string{h[0].ToString(), h[1].ToString()}
	}
	return hs
}

// Property reads what the engine asks of proxy-wasm's properties:
// source.address, and dynamic metadata one level deep
// (metadata.filter_metadata.<namespace>.<key>, a string). Deeper paths
// (jwt_authn's claims) are out of the SDK's reach: engine.Parse refuses the
// configurations that need them (engine.Options.FlatMetadata).
func (f *httpFilter) Property(path ...string) ([]byte, bool) {
	switch {
	case len(path) == 2 && path[0] == "source" && path[1] == "address":
		v, ok := f.handle.GetAttributeString(shared.AttributeIDSourceAddress)
		return v.ToBytes(), ok
	case len(path) == 4 && path[0] == "metadata" && path[1] == "filter_metadata":
		if v, ok := f.handle.GetMetadataString(shared.MetadataSourceTypeDynamic, path[2], path[3]); ok {
			return v.ToBytes(), true
		}
	}
	return nil, false
}

func (f *httpFilter) ReplaceRequestHeader(name, value string) error {
	f.handle.RequestHeaders().Set(name, value)
	return nil
}

// AddResponseHeader adds a header; Envoy copies value during the call.
func (f *httpFilter) AddResponseHeader(name, value string) error {
	f.handle.ResponseHeaders().Add(name, value)
	return nil
}

var errNoBody = errors.New(Name + ": no body chunk in this callback")

// ResponseBody returns size bytes from offset of the chunk OnResponseBody
// received: Envoy's own memory when they lie in one of its slices, else a
// copy into the filter's buffer. Either is valid until the next call or the
// callback's end (engine.Stream.ResponseBody): the engine scans it and
// keeps nothing, so a piece costs neither an allocation nor, mostly, a
// copy, and no garbage for the process's collector.
func (f *httpFilter) ResponseBody(offset, size int) ([]byte, error) {
	if f.body == nil {
		return nil, errNoBody
	}
	if f.chunks == nil {
		f.chunks = f.body.GetChunks()
	}
	out := f.piece[:0]
	for _, c := range f.chunks {
		b := c.ToUnsafeBytes()
		if offset >= len(b) {
			offset -= len(b)
			continue
		}
		b = b[offset:]
		offset = 0
		if len(out) == 0 && len(b) >= size {
			return b[:size], nil
		}
		out = append(out, b[:min(len(b), size-len(out))]...)
		if len(out) == size {
			break
		}
	}
	f.piece = out[:0]
	return out, nil
}

// RequestBody returns size bytes from offset of the request body chunk
// OnRequestBody received, as ResponseBody does for the response's.
func (f *httpFilter) RequestBody(offset, size int) ([]byte, error) {
	return f.ResponseBody(offset, size)
}

// SendReply answers the request with a local reply. Envoy does not run
// this filter's response callbacks for it (the SDK skips them), as the
// engine's local replies carry their headers already.
func (f *httpFilter) SendReply(status int, headers [][2]string, body []byte) error {
	f.paused = false
	f.handle.SendLocalResponse(uint32(status), headers, body, Name)
	return nil
}

func (f *httpFilter) Resume() error {
	f.paused = false
	f.handle.ContinueRequest()
	return nil
}

var errNoScheduler = errors.New(Name + ": the request has no scheduler (it never paused)")

// Run runs fn acting on the request, with the worker held: at once on the
// worker's own thread; from Envoy's main thread (the answer to a call the
// Plugin owns) through the stream's scheduler, on the worker's thread once
// the main thread lets the worker go. Envoy drops the scheduled work once
// the stream is complete (the engine's Done has settled it by then).
func (f *httpFilter) Run(fn func()) error {
	if f.w.owner.Load() == ownedByWorker {
		fn()
		return nil
	}
	sched := f.sched
	if sched == nil {
		return errNoScheduler
	}
	sched.Schedule(func() {
		defer f.w.exit(f.enter())
		defer f.recover("work scheduled for a request")
		fn()
	})
	return nil
}

// After holds the request (engine.Stream.After): a Go timer, on no Envoy
// thread, waits delay, then hands fn to the stream's scheduler, which runs
// it on the worker's thread with the worker held. No worker ever blocks on
// a hold. The timer takes the worker's lock only to check that the stream
// still holds this hold (holdGen) and to schedule; a stream that ended
// (dropHold, under the lock) runs nothing.
func (f *httpFilter) After(delay int64, fn func()) error {
	if f.sched == nil {
		f.sched = f.handle.GetScheduler()
	}
	f.dropHold()
	sched, w, gen := f.sched, f.w, f.holdGen
	f.timer = time.AfterFunc(time.Duration(delay), func() {
		w.enterMain()
		defer w.exitMain()
		if f.holdGen != gen || f.sched != sched {
			return
		}
		sched.Schedule(func() {
			defer w.exit(f.enter())
			defer f.recover("a held request")
			if f.holdGen == gen {
				fn()
			}
		})
	})
	return nil
}

// dropHold ends the filter's hold, if any: its function will not run. It
// runs with the worker held.
func (f *httpFilter) dropHold() {
	f.holdGen++
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
}

// Callout sends a call owned by this request, from its worker: its answer
// comes on the same thread, and the SDK drops it once the stream is done.
func (f *httpFilter) Callout(call *engine.Call, answer func(*engine.Answer)) error {
	a := &streamAnswer{f: f, answer: answer, maxBody: call.MaxBody}
	res, _ := f.handle.HttpCallout(call.Cluster, call.Headers, call.Body, uint64(call.TimeoutMS), a)
	if res == shared.HttpCalloutInitClusterNotFound { // the Wasm plugin's words (plugin.dispatch)
		return errors.New("no cluster " + strconv.Quote(call.Cluster) + " in Envoy")
	}
	if res != shared.HttpCalloutInitSuccess {
		return errors.New(Name + ": callout to cluster " + strconv.Quote(call.Cluster) + " not started: " + initResultText(res))
	}
	return nil
}

// streamAnswer delivers the answer of a request's call.
type streamAnswer struct {
	f       *httpFilter
	answer  func(*engine.Answer)
	maxBody int
}

// OnHttpCalloutDone implements shared.HttpCalloutCallback (the worker's
// thread).
func (a *streamAnswer) OnHttpCalloutDone(_ uint64, result shared.HttpCalloutResult, headers [][2]shared.UnsafeEnvoyBuffer, body []shared.UnsafeEnvoyBuffer) {
	f := a.f
	defer f.w.exit(f.enter())
	defer f.recover("the answer of a request's call")
	a.answer(readAnswer(result, headers, body, a.maxBody))
}

func initResultText(r shared.HttpCalloutInitResult) string {
	switch r {
	case shared.HttpCalloutInitMissingRequiredHeaders:
		return "missing required headers"
	case shared.HttpCalloutInitClusterNotFound:
		return "no such cluster"
	case shared.HttpCalloutInitDuplicateCalloutId:
		return "duplicate callout id"
	case shared.HttpCalloutInitCannotCreateRequest:
		return "cannot create the request"
	}
	return "result " + strconv.Itoa(int(r))
}

var (
	_ shared.HttpFilter = (*httpFilter)(nil)
	_ engine.Stream     = (*httpFilter)(nil)
)
