// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Command guest is a small proxy-wasm plugin that exercises every host facility
// package wasmhost implements, so the host can be tested without the real
// plugin. It is built for wasip1 by the tests (see wasmhost_test.go); it lives
// under testdata so that `go build ./...` ignores it.
//
// Plugin configuration: "fail" makes OnPluginStart fail; anything else is
// logged and kept. Requests are dispatched on :path:
//
//	/echo     adds, replaces and removes request headers, reads properties
//	/count    increments the shared-data key "count" in a bounded CAS loop
//	/deny     sends a local reply 429
//	/callout  dispatches an HTTP call to cluster "auth" and waits for it
//	/enqueue  enqueues the header x-item to the shared queue "guest.q", which
//	          every plugin context registers; proxy_on_queue_ready logs what
//	          it dequeues
//	/alloc    allocates garbage (for the GC soak test)
//	/gc       reports runtime.NumGC in a response header
//	/time     reports time.Now in a response header
//	/panic    panics (the host must report the trap)
package main

import (
	"runtime"
	"strconv"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

func main() {}

func init() { proxywasm.SetVMContext(&vm{}) }

type vm struct{ types.DefaultVMContext }

// NewPluginContext implements types.VMContext.
func (*vm) NewPluginContext(id uint32) types.PluginContext { return &plugin{id: id} }

type plugin struct {
	types.DefaultPluginContext
	id       uint32
	config   string
	requests proxywasm.MetricCounter
	denied   proxywasm.MetricCounter
	inflight proxywasm.MetricGauge
	sizes    proxywasm.MetricHistogram
}

// OnPluginStart implements types.PluginContext.
func (p *plugin) OnPluginStart(int) types.OnPluginStartStatus {
	cfg, err := proxywasm.GetPluginConfiguration()
	if err != nil && err != types.ErrorStatusNotFound {
		proxywasm.LogCriticalf("guest: reading configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	p.config = string(cfg)
	if p.config == "fail" {
		proxywasm.LogCritical("guest: configuration rejected")
		return types.OnPluginStartStatusFailed
	}
	vmCfg, _ := proxywasm.GetVMConfiguration()
	p.requests = proxywasm.DefineCounterMetric("guest.requests")
	p.denied = proxywasm.DefineCounterMetric("guest.denied")
	p.inflight = proxywasm.DefineGaugeMetric("guest.inflight")
	p.sizes = proxywasm.DefineHistogramMetric("guest.sizes")
	if err := proxywasm.SetTickPeriodMilliSeconds(1000); err != nil {
		proxywasm.LogErrorf("guest: tick: %v", err)
	}
	if _, err := proxywasm.RegisterSharedQueue(queueName); err != nil {
		proxywasm.LogErrorf("guest: register queue: %v", err)
	}
	proxywasm.LogInfof("guest: configured root=%d config=%q vm_config=%q", p.id, p.config, vmCfg)
	return types.OnPluginStartStatusOK
}

// OnPluginDone implements types.PluginContext.
func (p *plugin) OnPluginDone() bool {
	proxywasm.LogInfof("guest: plugin done root=%d", p.id)
	return true
}

// OnTick implements types.PluginContext.
func (p *plugin) OnTick() { proxywasm.LogInfof("guest: tick root=%d", p.id) }

const queueName = "guest.q"

// OnQueueReady implements types.PluginContext.
func (p *plugin) OnQueueReady(queueID uint32) {
	var items []string
	for {
		item, err := proxywasm.DequeueSharedQueue(queueID)
		if err == types.ErrorStatusEmpty {
			break
		}
		if err != nil {
			proxywasm.LogErrorf("guest: dequeue: %v", err)
			return
		}
		items = append(items, string(item))
	}
	proxywasm.LogInfof("guest: dequeued root=%d items=%v", p.id, items)
}

// NewHttpContext implements types.PluginContext.
func (p *plugin) NewHttpContext(id uint32) types.HttpContext { return &stream{id: id, plugin: p} }

type stream struct {
	types.DefaultHttpContext
	id     uint32
	plugin *plugin
	path   string
	count  string
	sink   []byte
}

var garbage [][]byte

// OnHttpRequestHeaders implements types.HttpContext.
func (s *stream) OnHttpRequestHeaders(int, bool) types.Action {
	s.plugin.requests.Increment(1)
	s.plugin.inflight.Add(1)
	path, err := proxywasm.GetHttpRequestHeader(":path")
	if err != nil {
		proxywasm.LogErrorf("guest: no :path: %v", err)
		return types.ActionContinue
	}
	s.path = path
	switch path {
	case "/echo":
		return s.echo()
	case "/count":
		return s.countRequest()
	case "/deny":
		s.plugin.denied.Increment(1)
		if err := proxywasm.SendHttpResponse(429, [][2]string{{"x-deny", "1"}, {"Retry-After", "3"}}, []byte("denied"), -1); err != nil {
			proxywasm.LogErrorf("guest: local reply: %v", err)
		}
		return types.ActionPause
	case "/callout":
		return s.callout()
	case "/enqueue":
		item, _ := proxywasm.GetHttpRequestHeader("x-item")
		id, err := proxywasm.ResolveSharedQueue("", queueName)
		if err == nil {
			err = proxywasm.EnqueueSharedQueue(id, []byte(item))
		}
		if err != nil {
			proxywasm.LogErrorf("guest: enqueue: %v", err)
		}
	case "/panic":
		panic("guest: boom")
	case "/alloc":
		// Keep a little, drop the rest: the heap grows and the collector runs.
		b := make([]byte, 32<<10)
		b[len(b)-1] = 1
		s.sink = b
		garbage = append(garbage, make([]byte, 1024))
		if len(garbage) > 64 {
			garbage = garbage[:0]
		}
		s.plugin.sizes.Record(uint64(len(b)))
	}
	return types.ActionContinue
}

func (s *stream) echo() types.Action {
	addr, err := proxywasm.GetProperty([]string{"source", "address"})
	if err != nil {
		proxywasm.LogErrorf("guest: source.address: %v", err)
	}
	meta, err := proxywasm.GetProperty([]string{"metadata", "filter_metadata", "guest", "tier"})
	if err != nil {
		meta = []byte("none")
	}
	reqPath, _ := proxywasm.GetProperty([]string{"request", "path"})
	xff, _ := proxywasm.GetHttpRequestHeader("X-Forwarded-For")
	all, _ := proxywasm.GetHttpRequestHeaders()
	must(proxywasm.AddHttpRequestHeader("x-guest-source", string(addr)))
	must(proxywasm.AddHttpRequestHeader("x-guest-tier", string(meta)))
	must(proxywasm.AddHttpRequestHeader("x-guest-xff", xff))
	must(proxywasm.AddHttpRequestHeader("x-guest-path", string(reqPath)))
	must(proxywasm.AddHttpRequestHeader("x-guest-count", strconv.Itoa(len(all))))
	must(proxywasm.ReplaceHttpRequestHeader("x-replace", "new"))
	must(proxywasm.RemoveHttpRequestHeader("x-remove"))
	// Envoy does not offer response headers while the request is decoded.
	if _, err := proxywasm.GetHttpResponseHeader(":status"); err != types.ErrorStatusBadArgument {
		proxywasm.LogErrorf("guest: response headers during request: %v", err)
	}
	return types.ActionContinue
}

const countKey = "count"

func (s *stream) countRequest() types.Action {
	for range 8 {
		v, cas, err := proxywasm.GetSharedData(countKey)
		n := 0
		switch err {
		case nil:
			n, _ = strconv.Atoi(string(v))
		case types.ErrorStatusNotFound:
			cas = 0
		default:
			proxywasm.LogErrorf("guest: get: %v", err)
			return types.ActionContinue
		}
		next := strconv.Itoa(n + 1)
		switch err := proxywasm.SetSharedData(countKey, []byte(next), cas); err {
		case nil:
			s.count = next
			return types.ActionContinue
		case types.ErrorStatusCasMismatch:
			proxywasm.LogDebug("guest: cas mismatch")
		default:
			proxywasm.LogErrorf("guest: set: %v", err)
			return types.ActionContinue
		}
	}
	must(proxywasm.SendHttpResponse(503, nil, []byte("contention"), -1))
	return types.ActionPause
}

func (s *stream) callout() types.Action {
	headers := [][2]string{{":method", "POST"}, {":path", "/check"}, {":authority", "auth.local"}, {"x-from", "guest"}}
	_, err := proxywasm.DispatchHttpCall("auth", headers, []byte("question"), nil, 500, func(numHeaders, bodySize, _ int) {
		hs, err := proxywasm.GetHttpCallResponseHeaders()
		if err != nil || numHeaders == 0 {
			must(proxywasm.SendHttpResponse(503, [][2]string{{"x-callout", "failed"}}, nil, -1))
			return
		}
		body, _ := proxywasm.GetHttpCallResponseBody(0, bodySize)
		status := ""
		for _, h := range hs {
			if h[0] == ":status" {
				status = h[1]
			}
		}
		if status != "200" {
			must(proxywasm.SendHttpResponse(403, [][2]string{{"x-callout-status", status}}, body, -1))
			return
		}
		must(proxywasm.AddHttpRequestHeader("x-callout-body", string(body)))
		must(proxywasm.ResumeHttpRequest())
	})
	if err != nil {
		proxywasm.LogErrorf("guest: dispatch: %v", err)
		must(proxywasm.SendHttpResponse(500, nil, []byte(err.Error()), -1))
	}
	return types.ActionPause
}

// OnHttpResponseHeaders implements types.HttpContext.
func (s *stream) OnHttpResponseHeaders(int, bool) types.Action {
	must(proxywasm.AddHttpResponseHeader("x-guest-resp", s.path))
	// Envoy drops the request headers once the request went upstream.
	if _, err := proxywasm.GetHttpRequestHeader(":path"); err == nil && s.path == "/echo" {
		proxywasm.LogError("guest: request headers still offered in the response path")
	}
	switch s.path {
	case "/count":
		must(proxywasm.AddHttpResponseHeader("x-count", s.count))
	case "/gc":
		must(proxywasm.AddHttpResponseHeader("x-gc", strconv.Itoa(int(numGC()))))
	case "/time":
		now := time.Now()
		must(proxywasm.AddHttpResponseHeader("x-time", strconv.FormatInt(now.UnixNano(), 10)))
		must(proxywasm.AddHttpResponseHeader("x-time-again", strconv.FormatInt(time.Now().UnixNano(), 10)))
	case "/echo":
		must(proxywasm.ReplaceHttpResponseHeader("server", "guest"))
		must(proxywasm.RemoveHttpResponseHeader("x-upstream-secret"))
	}
	return types.ActionContinue
}

// OnHttpStreamDone implements types.HttpContext.
func (s *stream) OnHttpStreamDone() {
	s.plugin.inflight.Add(-1)
	if s.path != "/alloc" {
		proxywasm.LogDebugf("guest: done %s", s.path)
	}
}

func numGC() uint32 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.NumGC
}

func must(err error) {
	if err != nil {
		proxywasm.LogErrorf("guest: host call failed: %v", err)
	}
}
