// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package wasmhost

import (
	"fmt"
	"sort"
	"strconv"
	"time"
)

// Request is one downstream HTTP request (headers only, end of stream).
type Request struct {
	// Headers are the request headers as Envoy hands them to the filter,
	// pseudo-headers (:method, :path, :authority, :scheme) included. Names are
	// lowercased by the host.
	Headers Headers
	// SourceAddress is the property source.address ("ip:port"); empty means
	// not found.
	SourceAddress string
	// Properties answer proxy_get_property for this stream, keyed by
	// PropertyPath(segments...), e.g. PropertyPath("metadata",
	// "filter_metadata", "ns", "key"). They take precedence over the built-in
	// ones (source.address, request.path/method/host/scheme/id,
	// request.headers.<name>, plugin_root_id) and over VM.SetProperty.
	Properties map[string][]byte
	// UpstreamHeaders and UpstreamBody are what the upstream answers if the
	// request gets there. Default: ":status: 200" and no body.
	UpstreamHeaders Headers
	UpstreamBody    []byte
}

// Response is the state of a stream after a step: finished (Paused false) or
// waiting (Paused true) for callouts or for the plugin to continue it.
type Response struct {
	StreamID uint32
	// Status is the final :status sent downstream (0 while paused or after a
	// reset); Headers and Body are the response as sent downstream, after
	// the plugin's proxy_on_response_headers.
	Status  int
	Headers Headers
	Body    []byte
	// LocalReply is the plugin's proxy_send_local_response, if it sent one.
	LocalReply *LocalReply
	// Forwarded holds the request headers as they reached the upstream (after
	// the plugin's changes); nil if the request never got there.
	Forwarded Headers
	// Paused: the stream waits. Callouts lists its pending callouts (answer
	// them with VM.AnswerCallout or VM.FailCallout); a paused stream without
	// callouts waits for nothing the host can deliver (VM.ResetStream ends it).
	Paused   bool
	Callouts []Callout
	// Reset: the stream was reset (proxy_close_stream or VM.ResetStream).
	Reset bool
}

// LocalReply is a proxy_send_local_response call.
type LocalReply struct {
	Status int
	// Headers are the plugin's additional headers (names lowercased).
	Headers    Headers
	Body       []byte
	Details    string
	GRPCStatus int32
}

// Callout is an HTTP call dispatched with proxy_http_call.
type Callout struct {
	ID       uint32
	Cluster  string
	Headers  Headers
	Body     []byte
	Trailers Headers
	Timeout  time.Duration // 0: none
	// ContextID is the context that dispatched it: a stream id, or the root
	// context id for calls made outside any stream.
	ContextID uint32
	root      uint32
}

type phase int

const (
	phaseRequest  phase = iota // request headers with the plugin
	phaseResponse              // response headers with the plugin
	phaseDone
)

type stream struct {
	id    uint32
	root  *rootContext
	req   Request
	phase phase

	reqHeaders  Headers
	reqLive     bool // the request header map is offered (mutable)
	respHeaders Headers
	respBody    []byte
	respLive    bool // the response header map is offered (mutable)
	bodyLive    bool // HTTP_RESPONSE_BODY is offered
	logPhase    bool // in proxy_on_log: both maps readable

	// Actions requested during a callback, taken after it returns.
	local        *LocalReply
	localTaken   bool
	continueReq  bool
	continueResp bool
	reset        bool

	forwarded Headers
}

// HTTP runs one request through the plugin: proxy_on_context_create,
// proxy_on_request_headers, then either the plugin's local reply or the
// upstream's response through proxy_on_response_headers (and
// proxy_on_response_body when there is a body), then proxy_on_log,
// proxy_on_done and proxy_on_delete. If the plugin pauses the request (for a
// callout), HTTP returns with Response.Paused; AnswerCallout and FailCallout
// continue the stream. The error reports a guest trap.
func (vm *VM) HTTP(req Request) (Response, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.failed != nil {
		return Response{}, vm.failed
	}
	vm.nextCtxID++
	s := &stream{
		id:         vm.nextCtxID,
		root:       vm.root,
		req:        req,
		reqHeaders: req.Headers.Clone(),
		reqLive:    true,
	}
	if s.reqHeaders == nil {
		s.reqHeaders = Headers{}
	}
	vm.streams[s.id] = s
	s.root.streams++
	if _, err := vm.call(vm.fn.contextCreate, "proxy_on_context_create", s.id, uint64(s.id), uint64(s.root.id)); err != nil {
		return Response{StreamID: s.id}, err
	}
	action, err := vm.call(vm.fn.requestHeaders, "proxy_on_request_headers", s.id, uint64(s.id), uint64(len(s.reqHeaders)), 1)
	if err != nil {
		return Response{StreamID: s.id}, err
	}
	if err := vm.settle(s, action, true); err != nil {
		return vm.response(s), err
	}
	err = vm.endStep()
	return vm.response(s), err
}

// AnswerCallout delivers the upstream's answer to callout id: the plugin's
// proxy_on_http_call_response sees headers (which should include :status)
// and body. It returns the state of the stream that dispatched the callout
// (zero if that was the root context or the stream has ended).
func (vm *VM) AnswerCallout(id uint32, headers Headers, body []byte) (Response, error) {
	return vm.deliver(id, &callResponse{headers: headers.Clone(), body: append([]byte(nil), body...)})
}

// FailCallout fails callout id (a reset, or its timeout elapsed): as in Envoy,
// proxy_on_http_call_response runs with no headers, body or trailers.
func (vm *VM) FailCallout(id uint32) (Response, error) {
	return vm.deliver(id, &callResponse{failed: true})
}

func (vm *VM) deliver(id uint32, cr *callResponse) (Response, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.failed != nil {
		return Response{}, vm.failed
	}
	c, ok := vm.callouts[id]
	if !ok {
		return Response{}, fmt.Errorf("wasmhost: callout %d: not pending", id)
	}
	delete(vm.callouts, id)
	vm.callResp = cr
	_, err := vm.call(vm.fn.callResponse, "proxy_on_http_call_response", c.root,
		uint64(c.root), uint64(id), uint64(len(cr.headers)), uint64(len(cr.body)), 0)
	vm.callResp = nil
	if err != nil {
		return Response{}, err
	}
	if err := vm.endStep(); err != nil {
		return Response{}, err
	}
	if s, ok := vm.streams[c.ContextID]; ok {
		return vm.response(s), nil
	}
	if s, ok := vm.ended[c.ContextID]; ok {
		return s, nil
	}
	return Response{StreamID: c.ContextID}, nil
}

// ResetStream resets a paused stream, as a downstream disconnect does:
// proxy_on_log, proxy_on_done and proxy_on_delete run; its callouts stay
// pending (they belong to the root context, as in Envoy).
func (vm *VM) ResetStream(id uint32) (Response, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.failed != nil {
		return Response{}, vm.failed
	}
	s, ok := vm.streams[id]
	if !ok {
		return Response{}, fmt.Errorf("wasmhost: stream %d: not in flight", id)
	}
	s.reset = true
	if err := vm.settle(s, 0, false); err != nil {
		return vm.response(s), err
	}
	err := vm.endStep()
	return vm.response(s), err
}

// Stream returns the state of stream id: in flight, or as it ended (the
// last 1024 ended streams are kept). A stream resumed by the answer to a
// callout of the root context shows here, not in AnswerCallout's result.
func (vm *VM) Stream(id uint32) (Response, bool) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if s, ok := vm.streams[id]; ok {
		return vm.response(s), true
	}
	r, ok := vm.ended[id]
	return r, ok
}

// PendingCallouts returns the callouts not yet answered, by id.
func (vm *VM) PendingCallouts() []Callout {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.pending(0, false)
}

func (vm *VM) pending(ctxID uint32, filter bool) []Callout {
	var out []Callout
	for _, c := range vm.callouts {
		if !filter || c.ContextID == ctxID {
			out = append(out, *c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// settleTouched takes the actions that callbacks requested on streams.
func (vm *VM) settleTouched() error {
	for len(vm.touched) > 0 {
		s := vm.touched[0]
		vm.touched = vm.touched[1:]
		if err := vm.settle(s, 0, false); err != nil {
			return err
		}
	}
	return nil
}

// settle moves s on after a callback returned: action is the callback's
// result if hasAction. It runs the next callbacks until the stream ends or
// waits, following Envoy's filter manager.
func (vm *VM) settle(s *stream, action uint64, hasAction bool) error {
	for s.phase != phaseDone {
		cont := hasAction && uint32(action) == actionContinue
		hasAction = false
		switch {
		case s.reset:
			return vm.finish(s)
		case s.local != nil && !s.localTaken:
			s.localTaken = true
			if s.phase == phaseResponse {
				// The response is being encoded: the local reply replaces it
				// without another pass through the plugin.
				s.respHeaders = localReplyHeaders(s.local)
				s.respBody = s.local.Body
				return vm.finish(s)
			}
			a, err := vm.respond(s, localReplyHeaders(s.local), s.local.Body)
			if err != nil {
				return err
			}
			action, hasAction = a, true
		case s.phase == phaseRequest && (cont || s.continueReq):
			s.continueReq = false
			s.reqLive = false
			s.forwarded = s.reqHeaders.Clone()
			headers := s.req.UpstreamHeaders.Clone()
			if len(headers) == 0 {
				headers = Headers{{":status", "200"}}
			}
			a, err := vm.respond(s, headers, s.req.UpstreamBody)
			if err != nil {
				return err
			}
			action, hasAction = a, true
		case s.phase == phaseResponse && (cont || s.continueResp):
			s.continueResp = false
			s.respLive = false
			if len(s.respBody) > 0 {
				s.bodyLive = true
				_, err := vm.call(vm.fn.responseBody, "proxy_on_response_body", s.id, uint64(s.id), uint64(len(s.respBody)), 1)
				s.bodyLive = false
				if err != nil {
					return err
				}
			}
			return vm.finish(s)
		default:
			return nil // paused
		}
	}
	return nil
}

// respond runs proxy_on_response_headers on headers (the upstream's or a
// local reply's) and returns its action.
func (vm *VM) respond(s *stream, headers Headers, body []byte) (uint64, error) {
	s.phase = phaseResponse
	s.respHeaders = headers
	s.respBody = append([]byte(nil), body...)
	s.respLive = true
	eos := uint64(0)
	if len(body) == 0 {
		eos = 1
	}
	return vm.call(vm.fn.responseHeaders, "proxy_on_response_headers", s.id, uint64(s.id), uint64(len(headers)), eos)
}

// finish ends s: proxy_on_log, proxy_on_done, proxy_on_delete.
func (vm *VM) finish(s *stream) error {
	s.phase = phaseDone
	s.reqLive, s.respLive = false, false
	s.logPhase = true
	_, err := vm.call(vm.fn.log, "proxy_on_log", s.id, uint64(s.id))
	s.logPhase = false
	if err != nil {
		return err
	}
	if _, err := vm.call(vm.fn.done, "proxy_on_done", s.id, uint64(s.id)); err != nil {
		return err
	}
	if _, err := vm.call(vm.fn.delete, "proxy_on_delete", s.id, uint64(s.id)); err != nil {
		return err
	}
	delete(vm.streams, s.id)
	vm.rememberEnded(vm.response(s))
	s.root.streams--
	if s.root.retired && s.root.streams == 0 && vm.roots[s.root.id] == s.root && !s.root.awaitDone {
		vm.retire(s.root)
	}
	return vm.failed
}

// rememberEnded keeps the last responses of ended streams, so that an answer
// to a callout can report how its stream ended.
func (vm *VM) rememberEnded(r Response) {
	if vm.ended == nil {
		vm.ended = make(map[uint32]Response)
	}
	if len(vm.ended) >= 1024 {
		for id := range vm.ended {
			delete(vm.ended, id)
		}
	}
	vm.ended[r.StreamID] = r
}

func (vm *VM) response(s *stream) Response {
	r := Response{StreamID: s.id, Reset: s.reset}
	if s.local != nil {
		lr := *s.local
		r.LocalReply = &lr
	}
	r.Forwarded = s.forwarded.Clone()
	if s.phase != phaseDone {
		r.Paused = true
		r.Callouts = vm.pending(s.id, true)
		return r
	}
	if s.reset {
		return r
	}
	r.Headers = s.respHeaders.Clone()
	r.Body = append([]byte(nil), s.respBody...)
	r.Status, _ = strconv.Atoi(r.Headers.Get(":status"))
	return r
}

// localReplyHeaders builds the headers of Envoy's local reply: :status, the
// plugin's headers, then content-length and content-type for a body.
func localReplyHeaders(lr *LocalReply) Headers {
	h := Headers{{":status", strconv.Itoa(lr.Status)}}
	h = append(h, lr.Headers.Clone()...)
	if len(lr.Body) > 0 {
		h.replace("content-length", strconv.Itoa(len(lr.Body)))
		if _, ok := h.Lookup("content-type"); !ok {
			h.add("content-type", "text/plain")
		}
	}
	return h
}
