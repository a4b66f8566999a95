package filter

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// Name is the filter's name (filter_name in Envoy's configuration) and the
// prefix of its metrics and logs.
const Name = engine.Name

// processStore is the shared data of every configuration in this Envoy
// process: buckets and leases outlive a reconfiguration, as in Envoy's
// proxy-wasm shared data.
var processStore = NewStore()

// ConfigFactory is the module's shared.HttpFilterConfigFactory: it turns a
// filter_config (the engine's JSON, the same as the Wasm plugin's) into a
// filter factory. Register it under Name.
type ConfigFactory struct {
	// metricsFor gives the sink of a configuration's metrics; nil is
	// newEnvoyMetrics (Envoy's config-level calls).
	metricsFor func(shared.HttpFilterConfigHandle) (sink, error)
	// start builds a worker's app; nil is the engine (startEngine). The
	// host-contract suite's module sets its own (contract.go).
	start func(h *host, conf *engine.Configuration, opts engine.Options) (engine.App, error)
}

// startEngine builds a worker's engine.
func startEngine(h *host, conf *engine.Configuration, opts engine.Options) (engine.App, error) {
	e, err := engine.NewPlugin(h, conf, "", opts)
	if err != nil {
		return nil, err
	}
	return engine.PluginApp{Plugin: e}, nil
}

// Create implements shared.HttpFilterConfigFactory. It runs on Envoy's main
// thread. An error makes Envoy refuse the filter's configuration; the line
// saying why is logged first.
func (cf ConfigFactory) Create(handle shared.HttpFilterConfigHandle, unparsed []byte) (f shared.HttpFilterFactory, err error) {
	defer func() {
		if r := recover(); r != nil {
			f, err = nil, errors.New(Name+": panic while loading the configuration: "+panicText(r))
			handle.Log(shared.LogLevelCritical, "%s", err.Error())
		}
	}()
	if !cgocheckOff(os.Getenv("GODEBUG")) {
		handle.Log(shared.LogLevelCritical, "%s", errGodebug)
		return nil, errors.New(errGodebug)
	}
	if line := envoyCallbacks(); line != "" {
		handle.Log(shared.LogLevelCritical, "%s", line)
		return nil, errors.New(line)
	}
	tuneRuntime()
	metricsFor := cf.metricsFor
	if metricsFor == nil {
		metricsFor = newEnvoyMetrics
	}
	s, err := metricsFor(handle)
	if err != nil {
		handle.Log(shared.LogLevelCritical, "%s", err.Error())
		return nil, err
	}
	// The configuration is parsed once: this host reads no nested metadata
	// (Options.FlatMetadata). Every worker's Plugin is built from it
	// (newWorker); this one defines the metrics.
	conf, err := engine.Parse(unparsed, engine.Options{FlatMetadata: true})
	if err != nil {
		handle.Log(shared.LogLevelCritical, "%s", err.Error()) // an *engine.RefusalError: the line to log
		return nil, err
	}
	c := &filterConfig{
		handle:    handle,
		conf:      conf,
		store:     processStore,
		metrics:   newMetrics(s),
		memory:    &engine.MemoryReport{},
		readsBody: conf.ReadsResponseBody(),

		readsRequestBody: conf.ReadsRequestBody(),
		start:            cf.start,
	}
	if c.start == nil {
		c.start = startEngine
	}
	if _, err := engine.NewPlugin(&host{c: c, defining: true}, conf, "", c.options()); err != nil {
		handle.Log(shared.LogLevelCritical, "%s", err.Error())
		return nil, err
	}
	c.panics = c.metrics.define(handle, Name+".panics", false)
	c.sched = handle.GetScheduler()
	processTicker.register(c)
	handle.Log(shared.LogLevelInfo, "%s", Name+": native module started, GOMAXPROCS "+strconv.Itoa(runtime.GOMAXPROCS(0))+" (native build, version "+engine.Version()+")")
	return c, nil
}

// CreatePerRoute implements shared.HttpFilterConfigFactory: the filter has
// no per-route configuration.
func (ConfigFactory) CreatePerRoute([]byte) (any, error) {
	return nil, errors.New(Name + ": no per-route configuration: configure the filter itself")
}

// filterConfig is one configuration: its workers and what they share.
type filterConfig struct {
	handle shared.HttpFilterConfigHandle
	conf   *engine.Configuration
	store  *Store
	// memory is what this configuration's metrics have of the process's Go
	// runtime so far: every worker's Plugin reports the same runtime.
	memory  *engine.MemoryReport
	metrics *metrics
	panics  *metric
	workers workers
	start   func(h *host, conf *engine.Configuration, opts engine.Options) (engine.App, error)
	// readsBody: some rule takes its cost from the response body (the
	// body callbacks are the engine's only then).
	readsBody bool
	// readsRequestBody: some rule reads a request_json value (the request
	// body callbacks are the engine's only then).
	readsRequestBody bool

	mu      sync.Mutex // guards sched against OnDestroy
	sched   shared.Scheduler
	stopped bool
	// life guards the configuration's end against the process's tick,
	// which runs through another configuration's scheduler (Envoy keeps
	// only that one alive while it runs): should Envoy destroy this one on
	// another thread, OnDestroy waits for a tick of it in progress, and
	// none starts after.
	life      sync.RWMutex
	destroyed bool
}

// Create implements shared.HttpFilterFactory: a filter for one stream, on
// the worker thread that runs it, with that thread's engine Plugin.
func (c *filterConfig) Create(handle shared.HttpFilterHandle) shared.HttpFilter {
	key := threadKey(handle)
	w, err := c.workers.get(key, func() (*worker, error) {
		threadSeen(key)
		return c.newWorker()
	})
	if err != nil {
		c.log(engine.LogCritical, Name+": no engine for this worker, requests pass unchecked: "+err.Error())
		return &shared.EmptyHttpFilter{}
	}
	h := w.enter()
	defer w.exit(h)
	var f *httpFilter
	if n := len(w.free); n > 0 {
		f = w.free[n-1]
		w.free[n-1] = nil
		w.free = w.free[:n-1]
	} else {
		f = &httpFilter{c: c, w: w}
	}
	if f.e != w.e { // new, or the worker's engine was replaced after a panic
		f.e, f.r = w.e, w.e.NewRequest(f)
	}
	f.handle = handle
	return f
}

// newWorker builds a worker's Plugin.
func (c *filterConfig) newWorker() (*worker, error) {
	w := &worker{}
	e, err := c.start(&host{c: c, w: w}, c.conf, c.options())
	if err != nil {
		return nil, err
	}
	w.e = e
	return w, nil
}

// options are the engine's Options for this configuration's Plugins.
func (c *filterConfig) options() engine.Options {
	return engine.Options{FlatMetadata: true, Memory: c.memory}
}

// OnDestroy implements shared.HttpFilterFactory: Envoy dropped the
// configuration; nothing is scheduled for it any more, and the process's
// ticker no longer ticks it.
func (c *filterConfig) OnDestroy() {
	processTicker.unregister(c)
	c.life.Lock()
	c.destroyed = true
	c.life.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
}

// errStopped is the error of work scheduled after the configuration is gone.
var errStopped = errors.New(Name + ": the configuration was removed")

// schedule runs f on Envoy's main thread (any thread may call it). A panic
// in f is recovered and counted.
func (c *filterConfig) schedule(f func()) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errStopped
	}
	c.sched.Schedule(func() {
		defer c.recoverMain("scheduled work", nil)
		f()
	})
	return nil
}

// tick is every worker Plugin's tick (the process's ticker runs it on the
// main thread once a second, tick.go), one after the other, each under its
// worker's lock. The memory figures ms are the process's, and the Plugins
// share the configuration's MemoryReport: the first reports them, and the
// others find nothing changed since.
func (c *filterConfig) tick(ms *runtime.MemStats) {
	c.life.RLock()
	defer c.life.RUnlock()
	if c.destroyed {
		return
	}
	c.workers.each(func(w *worker) {
		w.enterMain()
		defer w.exitMain()
		defer c.recoverMain("tick", w)
		w.e.Tick(ms)
	})
}

// recoverMain recovers a panic on the main thread: counted, logged, and
// w's engine replaced.
func (c *filterConfig) recoverMain(where string, w *worker) {
	if r := recover(); r != nil {
		c.metrics.add(c.panics, 1)
		c.log(engine.LogCritical, Name+": panic in "+where+" (counted in "+Name+".panics): "+panicText(r))
		if w != nil {
			c.replaceEngine(w)
		}
	}
}

// replaceEngine gives w a new Plugin after a panic left its state unknown
// (held with w's lock). Requests in flight keep the old one.
func (c *filterConfig) replaceEngine(w *worker) {
	if e, err := c.start(&host{c: c, w: w}, c.conf, c.options()); err == nil {
		w.e = e
	}
}

// log writes one line to Envoy's log (safe from any thread).
func (c *filterConfig) log(level engine.LogLevel, msg string) {
	l := shared.LogLevelInfo
	switch level {
	case engine.LogCritical:
		l = shared.LogLevelCritical
	case engine.LogWarn:
		l = shared.LogLevelWarn
	}
	c.handle.Log(l, "%s", msg)
}

// panicText is a recovered value as text.
func panicText(r any) string {
	switch v := r.(type) {
	case error:
		return v.Error()
	case string:
		return v
	}
	return "unknown panic value"
}

// threadKey names the Envoy thread running handle's filter: Envoy's worker
// index (one cgo call), or, should the SDK's handle ever not be the type
// envoyptr.go reads, the OS thread id (a system call), kept apart from the
// indexes by its sign.
func threadKey(handle shared.HttpFilterHandle) int {
	if i, ok := workerIndex(handle); ok {
		return i
	}
	return -syscall.Gettid()
}
