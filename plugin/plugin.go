// Package plugin runs the rate limiter's engine (package engine) as a
// proxy-wasm plugin: a VM context, a plugin context per configuration that
// builds the engine in OnPluginStart, and an HTTP context per request that
// hands the request's callbacks to an engine.Request. It is the only route
// from the engine to the host: every proxy-wasm call the engine needs goes
// through host (the plugin's) or stream (a request's), and the imports the
// SDK lacks (the clock, metrics) are declared here.
//
// Garbage collection is this adapter's too: a Wasm VM collects on the
// plugin's 1 s tick rather than inside requests (see collectOnTick).
//
// Cost: an allowed request makes 10 host calls (one header read, one
// shared-data read and one write, one counter, one clock read, five response
// headers) and no allocation of its own: HTTP contexts and their engine
// requests are reused (OnHttpStreamDone), unless GOGC is set for the VM.
package plugin

import (
	"os"
	"runtime"
	"runtime/debug"
	"strconv"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// Name prefixes the plugin's shared-data keys, metrics and logs.
const Name = engine.Name

// NewVMContext returns the VM context to hand to proxywasm.SetVMContext.
func NewVMContext() types.VMContext { return &vmContext{now: wallClock, sd: sharedData{}} }

type vmContext struct {
	types.DefaultVMContext
	now func() int64 // the clock, Unix ns
	sd  engine.SharedData
	// bodyBudget overrides the engine's body budget when not 0 (tests).
	bodyBudget int
	// start builds what a plugin context runs; nil is the engine
	// (startEngine). The host-contract suite's guest sets its own
	// (contract.go).
	start func(h *host, data []byte, rootID string, opts engine.Options) (app, error)
	// memory is what this VM's Go runtime has reported to the memory
	// metrics so far, shared by its plugin contexts (engine.MemoryReport):
	// a reconfiguration carries on from it.
	memory engine.MemoryReport
}

// OnVMStart implements types.VMContext: it takes garbage collection off the
// request path (see collectOnTick).
func (v *vmContext) OnVMStart(int) types.OnVMStartStatus {
	// Natively (tests) the process's collector is left alone; in a VM,
	// vm_config's environment_variables decide when they set GOGC.
	if runtime.GOOS == "wasip1" && os.Getenv("GOGC") == "" {
		collectOnTicks = true
		debug.SetGCPercent(-1)
		debug.SetMemoryLimit(gcMemoryLimit)
	}
	return types.OnVMStartStatusOK
}

// Garbage collection. A collection inside a request callback stops that
// request for the whole mark phase, so a VM collects on its 1 s tick
// instead (collectOnTick), once its heap has doubled since the last
// collection (as GOGC=100 would) and holds at least gcMinHeap. Between
// ticks the heap only grows; gcMemoryLimit is the runtime's backstop (a
// soft limit: the collector runs at a request when the VM's memory nears
// it). Setting GOGC in vm_config.environment_variables restores the
// runtime's own pacing.
const (
	gcMinHeap     uint64 = 4 << 20
	gcMemoryLimit        = 64 << 20
)

var (
	collectOnTicks bool        // set by OnVMStart unless GOGC is set
	nextGC         = gcMinHeap // the heap size at which a tick collects
)

// collectOnTick collects when the heap has reached nextGC.
func collectOnTick(heap uint64) {
	if !collectOnTicks || heap < nextGC {
		return
	}
	collect()
}

// collect runs a collection and sets the next tick's threshold.
func collect() {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	nextGC = max(2*ms.HeapAlloc, gcMinHeap)
	bodyRead = 0
}

// Response bodies read for costs are copied into the VM and are garbage once
// scanned: a worker streaming large answers reads far more between two ticks
// than the memory limit. Left to the limit, Go's collector would run at every
// allocation and then, its CPU limiter overriding the limit, let the heap and
// the VM's memory (which never shrinks) grow by hundreds of MiB. So a VM
// collects once it has read bodyGCBytes of bodies since its last collection:
// body garbage never exceeds that (TestWasmBodyGarbageBounded).
const bodyGCBytes = 16 << 20

var bodyRead int // body bytes read since the last collection

// readBody counts n bytes of a body read into the VM.
func readBody(n int) {
	if !collectOnTicks {
		return
	}
	if bodyRead += n; bodyRead >= bodyGCBytes {
		collect()
	}
}

// NewPluginContext implements types.VMContext.
func (v *vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	start := v.start
	if start == nil {
		start = startEngine
	}
	return &pluginContext{id: contextID, host: host{id: contextID, now: v.now, sd: v.sd}, bodyBudget: v.bodyBudget, memory: &v.memory, start: start}
}

// app is what a plugin context runs (engine.App: the engine, or the
// host-contract suite's driver of the same host, contract.go), with what
// the start's log line reports.
type app interface {
	engine.App
	Rules() int
	MaxKeys() int
}

// engineApp is the engine as an app.
type engineApp struct{ engine.PluginApp }

// startEngine builds the engine for a configuration.
func startEngine(h *host, data []byte, rootID string, opts engine.Options) (app, error) {
	e, err := engine.New(h, data, rootID, opts)
	if err != nil {
		return nil, err
	}
	return engineApp{engine.PluginApp{Plugin: e}}, nil
}

// pluginContext runs one configuration's engine.
type pluginContext struct {
	types.DefaultPluginContext
	id         uint32
	host       host
	bodyBudget int
	memory     *engine.MemoryReport // the VM's
	start      func(h *host, data []byte, rootID string, opts engine.Options) (app, error)
	e          app
	free       []*httpContext // contexts of finished streams, for reuse
	holds      holds          // requests the engine holds (timers.go)
}

// maxFreeContexts bounds the contexts a plugin context keeps for reuse: a
// burst of concurrent requests leaves at most that many behind.
const maxFreeContexts = 128

// OnPluginStart implements types.PluginContext.
func (p *pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil && err != types.ErrorStatusNotFound {
		proxywasm.LogCritical(Name + ": reading the plugin configuration: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	rootID := ""
	if v, err := proxywasm.GetProperty([]string{"plugin_root_id"}); err == nil {
		rootID = string(v)
	}
	e, err := p.start(&p.host, data, rootID, engine.Options{BodyBudget: p.bodyBudget, Memory: p.memory})
	if err != nil {
		proxywasm.LogCritical(err.Error()) // an *engine.RefusalError: the line to log
		return types.OnPluginStartStatusFailed
	}
	p.e = e
	if err := proxywasm.SetTickPeriodMilliSeconds(1000); err != nil {
		proxywasm.LogWarn(Name + ": no ticks, memory gauges stay at 0: " + err.Error())
	}
	if err := p.host.registerQueue(); err != nil {
		proxywasm.LogWarn(Name + ": no shared queue, calls the plugin owns wait for its tick: " + err.Error())
	}
	proxywasm.LogInfo(Name + ": started with " + strconv.Itoa(e.Rules()) + " rules, max_keys " + strconv.Itoa(e.MaxKeys()) + " (wasm build, version " + engine.Version() + ")")
	return types.OnPluginStartStatusOK
}

// OnTick implements types.PluginContext: the calls still waiting for the
// plugin context (see host), the engine's tick, then garbage collection
// when due.
func (p *pluginContext) OnTick() {
	active = p.id
	now := p.host.now()
	p.holds.runDue(now, p.id)
	if !p.holds.slowDue(now) {
		return
	}
	p.host.onTick()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	p.e.Tick(&ms)
	collectOnTick(ms.HeapAlloc) // after the report: its collection shows at the next tick
}

// OnQueueReady implements types.PluginContext: the plugin context is woken
// to send the calls it owns that a request caused (see host).
func (p *pluginContext) OnQueueReady(queueID uint32) {
	active = p.id
	p.host.onQueueReady(queueID)
}

// NewHttpContext implements types.PluginContext. It reuses a context whose
// stream is done (see OnHttpStreamDone), so a request allocates none.
func (p *pluginContext) NewHttpContext(contextID uint32) types.HttpContext {
	if n := len(p.free); n > 0 {
		c := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		c.id = contextID
		return c
	}
	c := &httpContext{plugin: p, id: contextID}
	c.r = p.e.NewRequest(stream{c})
	return c
}

// httpContext hands one request's callbacks to its engine.Request.
type httpContext struct {
	types.DefaultHttpContext
	plugin *pluginContext
	id     uint32
	gen    uint64 // the requests this context has finished
	r      engine.Handler
	// The request body as Envoy hands it: while the engine holds the
	// request, Envoy buffers the body and each callback's size is the
	// whole body so far (buffered); reqBase is where this callback's new
	// bytes start in it (stream.RequestBody reads from there).
	buffered bool
	reqBase  int
}

// OnHttpRequestHeaders implements types.HttpContext: headers a body
// follows go to the engine as such (it waits for the body when a rule
// reads it: request_json).
func (c *httpContext) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	active = c.id
	c.buffered, c.reqBase = false, 0
	if endOfStream {
		return action(c.r.OnRequestHeaders())
	}
	a := c.r.OnRequestHeadersWithBody()
	if w, ok := c.r.(interface{ WaitsForBody() bool }); ok && a == engine.Pause && w.WaitsForBody() {
		// A paused header would stop the body too (proxy-wasm turns it
		// into stop-all): the headers go on, the body is held
		// (engine.Request.WaitsForBody).
		return types.ActionContinue
	}
	return action(a)
}

// OnHttpRequestBody implements types.HttpContext: the engine sees the
// bytes new since the last call.
func (c *httpContext) OnHttpRequestBody(size int, endOfStream bool) types.Action {
	active = c.id
	if !c.buffered {
		c.reqBase = 0
	}
	a := action(c.r.OnRequestBody(size-c.reqBase, endOfStream))
	c.buffered = a == types.ActionPause // Envoy buffers the body: the next size counts it
	c.reqBase = size
	return a
}

// OnHttpRequestTrailers implements types.HttpContext.
func (c *httpContext) OnHttpRequestTrailers(int) types.Action {
	active = c.id
	return action(c.r.OnRequestTrailers())
}

// OnHttpResponseHeaders implements types.HttpContext.
func (c *httpContext) OnHttpResponseHeaders(_ int, endOfStream bool) types.Action {
	active = c.id
	return action(c.r.OnResponseHeaders(endOfStream))
}

// OnHttpResponseBody implements types.HttpContext.
func (c *httpContext) OnHttpResponseBody(size int, endOfStream bool) types.Action {
	active = c.id
	return action(c.r.OnResponseBody(size, endOfStream))
}

// OnHttpResponseTrailers implements types.HttpContext.
func (c *httpContext) OnHttpResponseTrailers(int) types.Action {
	active = c.id
	return action(c.r.OnResponseTrailers())
}

// OnHttpStreamDone implements types.HttpContext (the SDK calls it from
// proxy_on_log): the request is done, so the context and its engine request
// serve a later request. An answer to a callout of this request that
// arrives later is dropped (stream.Callout).
func (c *httpContext) OnHttpStreamDone() {
	p := c.plugin
	if c.id == 0 {
		return // already free (a host calling both proxy_on_log and proxy_on_delete)
	}
	active = c.id
	c.r.Done()
	c.id = 0
	c.gen++
	if len(p.free) < maxFreeContexts {
		p.free = append(p.free, c)
	}
}

func action(a engine.Action) types.Action {
	if a == engine.Pause {
		return types.ActionPause
	}
	return types.ActionContinue
}
