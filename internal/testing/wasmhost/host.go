// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package wasmhost is a small proxy-wasm ABI 0.2.0 host on wazero that runs a
// compiled plugin (a WASI reactor built by the standard Go compiler) in Go
// tests, playing Envoy.
//
// The model follows Envoy and proxy-wasm-cpp-host:
//
//   - A Host is the proxy process: one shared-data map, one set of metrics,
//     one log, one clock. A VM is a worker thread's Wasm instance: its own
//     module instance, so Go globals in the guest are per VM, exactly as in
//     Envoy. Distinct VMs may be driven from different goroutines at once;
//     one VM serialises its own calls.
//   - Shared data has Envoy's CAS semantics: a set on an existing key fails
//     with CasMismatch iff cas != 0 and cas differs from the key's CAS; a set
//     on a missing key always succeeds; every successful set takes the next
//     value of one process-wide counter that starts at 1 and skips 0.
//   - The guest's clock (WASI clock_time_get, realtime and monotonic alike)
//     reads the Host's clock, which moves only by SetTime and Advance: the
//     guest sees exactly the time set, however often it reads it.
//   - A VM starts as Envoy starts a worker's plugin: _initialize once, then for
//     the root context proxy_on_context_create(root, 0), proxy_on_vm_start and
//     proxy_on_configure. VM.Reconfigure creates a new root context the same
//     way, as Envoy does on a configuration update, and retires the old one
//     (proxy_on_done, proxy_on_delete) once its streams have ended.
//   - VM.HTTP runs one HTTP stream through the plugin (request headers,
//     local reply or upstream response, response headers, body, log, done,
//     delete). Actions the plugin asks for during a callback (local reply,
//     continue, close) take effect when the callback returns, as in Envoy. A
//     local reply passes through the plugin's own proxy_on_response_headers.
//     HTTP callouts are recorded; the test answers or fails them with
//     VM.AnswerCallout and VM.FailCallout, which resume the stream.
//   - Shared queues are the process's, by name; proxy_on_queue_ready runs
//     for the last registration's root context once the callbacks of the
//     VM's current step have returned, as Envoy posts it to the worker's
//     event loop (queue.go).
//   - Header maps are available when Envoy makes them available: request
//     headers until the request continues upstream, response headers until
//     they continue downstream, both read-only in proxy_on_log, callout
//     response headers and body during proxy_on_http_call_response.
//
// Why not the SDK's own (proxytest.NewWasmVMContext, which also runs a
// compiled module on wazero and calls _initialize): it has no
// proxy_get_current_time_nanoseconds (the plugin imports it, so the module
// does not instantiate there) and gives the guest wazero's fake clock where
// a test sets the time; its shared data refuses a set with CAS 0 on an
// existing key, which Envoy accepts; it runs proxy_on_queue_ready
// inside the enqueue instead of posting it; and it compiles the module on
// every call (seconds for a Go module), with no cache.
//
// Not modelled: request bodies and trailers, VM-wide properties, unknown
// upstream clusters (every name is accepted), and the host functions neither
// the plugin nor the test guest imports: gRPC calls, foreign
// functions, proxy_set_property, proxy_set_buffer_bytes,
// proxy_set_header_map_pairs, proxy_close_stream, proxy_done and
// proxy_get_metric all answer Unimplemented (a body buffer Envoy does not
// have reads empty). Status codes follow Envoy 1.40.
package wasmhost

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// Host is one proxy process: shared data, metrics, logs and a clock shared by
// its VMs. Its methods are safe for concurrent use.
type Host struct {
	eng  *engine
	opts options
	now  atomic.Int64 // Unix ns of the guest's clock

	mu        sync.Mutex
	shared    map[string]sharedEntry
	nextCAS   uint32
	metrics   map[metricKey]*metric
	metricIDs map[uint32]*metric
	logs      []LogEntry
	vms       []*VM
	nextVM    int
	onGet     func(key string) (value []byte, cas uint32, st Status, override bool)
	onSet     func(key string, value []byte, cas uint32) (st Status, override bool)
	onReply   func(status int) Status
	onCall    func(cluster string) Status

	queueTokens map[string]uint32 // shared queues by name (queue.go)
	queues      map[uint32]*sharedQueue
	nextQueue   uint32
}

// LogEntry is one line the guest logged with proxy_log, or wrote to stdout
// (at info) or stderr (at error), as Envoy logs them.
type LogEntry struct {
	VM      int // the worker number, from 1
	Level   LogLevel
	Message string
}

// SharedEntry is a shared-data value and its CAS.
type SharedEntry struct {
	Value []byte
	CAS   uint32
}

type sharedEntry struct {
	value []byte
	cas   uint32
}

// Option configures a Host.
type Option func(*options)

type options struct {
	vmConfig []byte
	start    time.Time
}

// WithVMConfiguration sets the VM configuration (the buffer VM_CONFIGURATION
// the guest reads in proxy_on_vm_start). Default: empty.
func WithVMConfiguration(b []byte) Option {
	return func(o *options) { o.vmConfig = append([]byte(nil), b...) }
}

// WithStartTime sets the clock's initial time. Default: 2026-01-01T00:00:00Z.
func WithStartTime(t time.Time) Option { return func(o *options) { o.start = t } }

// NewHost prepares a host for the compiled module wasm. The module is compiled
// once per process (by content) and reused by every Host, since compiling a
// Go-built module takes seconds; the compiled code is also kept on disk
// across processes (see CacheDirEnv). NewHost fails if the module is not a proxy-wasm
// 0.2.0 WASI reactor or imports a function the host cannot provide.
func NewHost(ctx context.Context, wasm []byte, opts ...Option) (*Host, error) {
	o := options{start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	for _, opt := range opts {
		opt(&o)
	}
	eng, err := loadEngine(ctx, wasm)
	if err != nil {
		return nil, err
	}
	h := &Host{
		eng:       eng,
		opts:      o,
		shared:    make(map[string]sharedEntry),
		nextCAS:   1,
		metrics:   make(map[metricKey]*metric),
		metricIDs: make(map[uint32]*metric),

		queueTokens: make(map[string]uint32),
		queues:      make(map[uint32]*sharedQueue),
	}
	h.now.Store(o.start.UnixNano())
	return h, nil
}

// Close closes every VM of the host. The compiled module stays cached.
func (h *Host) Close() error {
	h.mu.Lock()
	vms := h.vms
	h.vms = nil
	h.mu.Unlock()
	var first error
	for _, vm := range vms {
		if err := vm.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Now returns the guest's current time.
func (h *Host) Now() time.Time { return time.Unix(0, h.now.Load()).UTC() }

// SetTime sets the guest's clock to t.
func (h *Host) SetTime(t time.Time) { h.now.Store(t.UnixNano()) }

// Advance moves the guest's clock by d (which may be negative).
func (h *Host) Advance(d time.Duration) { h.now.Add(int64(d)) }

func (h *Host) walltime() (int64, int32) {
	ns := h.now.Load()
	sec, nsec := ns/1e9, ns%1e9
	if nsec < 0 {
		sec, nsec = sec-1, nsec+1e9
	}
	return sec, int32(nsec)
}

func (h *Host) nanotime() int64 { return h.now.Load() }

// GetSharedData returns the value and CAS of key, bypassing the hooks.
func (h *Host) GetSharedData(key string) (value []byte, cas uint32, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.shared[key]
	if !ok {
		return nil, 0, false
	}
	return append([]byte(nil), e.value...), e.cas, true
}

// SetSharedData sets key with Envoy's semantics (see the package doc),
// bypassing the hooks: tests use it to seed data or to play a competing
// worker. It returns StatusOK or StatusCasMismatch.
func (h *Host) SetSharedData(key string, value []byte, cas uint32) Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e, ok := h.shared[key]; ok && cas != 0 && cas != e.cas {
		return StatusCasMismatch
	}
	h.shared[key] = sharedEntry{value: append([]byte(nil), value...), cas: h.nextCAS}
	h.nextCAS++
	if h.nextCAS == 0 {
		h.nextCAS = 1
	}
	return StatusOK
}

// SharedData returns a copy of the whole shared-data map.
func (h *Host) SharedData() map[string]SharedEntry {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]SharedEntry, len(h.shared))
	for k, e := range h.shared {
		out[k] = SharedEntry{Value: append([]byte(nil), e.value...), CAS: e.cas}
	}
	return out
}

// SharedDataLen returns the number of shared-data keys.
func (h *Host) SharedDataLen() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.shared)
}

// OnGetSharedData installs f to run before each of the guest's
// proxy_get_shared_data calls (nil removes it). If f returns override, the
// guest gets value, cas and st instead of the stored entry. f runs without the
// host's lock: it may call GetSharedData and SetSharedData, but not VM methods
// of the VM that is calling.
func (h *Host) OnGetSharedData(f func(key string) (value []byte, cas uint32, st Status, override bool)) {
	h.mu.Lock()
	h.onGet = f
	h.mu.Unlock()
}

// OnSetSharedData installs f to run before each of the guest's
// proxy_set_shared_data calls (nil removes it). If f returns override, the
// set is not performed and the guest gets st. To force a CAS race, f can call
// h.SetSharedData(key, other, 0) and return override false: the guest's set
// then fails with CasMismatch. The same rules as OnGetSharedData apply.
func (h *Host) OnSetSharedData(f func(key string, value []byte, cas uint32) (st Status, override bool)) {
	h.mu.Lock()
	h.onSet = f
	h.mu.Unlock()
}

// OnHTTPCall installs f to run before each of the guest's proxy_http_call
// calls (nil removes it). If f returns a status other than StatusOK, the call
// is not made and the guest gets that status, as from a host that refuses it
// (Envoy: an unknown cluster, a connection limit).
func (h *Host) OnHTTPCall(f func(cluster string) Status) {
	h.mu.Lock()
	h.onCall = f
	h.mu.Unlock()
}

func (h *Host) guestHTTPCall(cluster string) Status {
	h.mu.Lock()
	f := h.onCall
	h.mu.Unlock()
	if f == nil {
		return StatusOK
	}
	return f(cluster)
}

// OnSendLocalResponse installs f to run before each of the guest's
// proxy_send_local_response calls (nil removes it). If f returns a status
// other than StatusOK, the reply is not sent and the guest gets that status,
// as from a host that cannot send it.
func (h *Host) OnSendLocalResponse(f func(status int) Status) {
	h.mu.Lock()
	h.onReply = f
	h.mu.Unlock()
}

func (h *Host) guestReply(status int) Status {
	h.mu.Lock()
	hook := h.onReply
	h.mu.Unlock()
	if hook == nil {
		return StatusOK
	}
	return hook(status)
}

func (h *Host) guestGetShared(key string) ([]byte, uint32, Status) {
	h.mu.Lock()
	hook := h.onGet
	h.mu.Unlock()
	if hook != nil {
		if v, cas, st, ok := hook(key); ok {
			return v, cas, st
		}
	}
	v, cas, ok := h.GetSharedData(key)
	if !ok {
		return nil, 0, StatusNotFound
	}
	return v, cas, StatusOK
}

func (h *Host) guestSetShared(key string, value []byte, cas uint32) Status {
	h.mu.Lock()
	hook := h.onSet
	h.mu.Unlock()
	if hook != nil {
		if st, ok := hook(key, value, cas); ok {
			return st
		}
	}
	return h.SetSharedData(key, value, cas)
}

type metricKey struct {
	typ  uint32
	name string
}

type metric struct {
	id      uint32
	name    string
	typ     uint32
	value   int64
	samples []uint64
}

const maxHistogramSamples = 100000

// defineMetric returns the id of the metric (typ, name), the same id for the
// same metric in every VM. The low two bits of an id are its type, as in Envoy.
func (h *Host) defineMetric(typ uint32, name string) (uint32, Status) {
	if typ > metricHistogram {
		return 0, StatusBadArgument
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	k := metricKey{typ, name}
	if m, ok := h.metrics[k]; ok {
		return m.id, StatusOK
	}
	m := &metric{id: uint32(len(h.metrics)+1)<<2 | typ, name: name, typ: typ}
	h.metrics[k] = m
	h.metricIDs[m.id] = m
	return m.id, StatusOK
}

// incrementMetric and recordMetric follow Envoy's rules: counters only grow
// (an offset <= 0 is BadArgument), gauges add or subtract, histograms record.
func (h *Host) incrementMetric(id uint32, offset int64) Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, ok := h.metricIDs[id]
	if !ok {
		if id&3 == metricHistogram {
			return StatusBadArgument
		}
		return StatusNotFound
	}
	switch m.typ {
	case metricCounter:
		if offset <= 0 {
			return StatusBadArgument
		}
		m.value += offset
	case metricGauge:
		m.value += offset
	default:
		return StatusBadArgument
	}
	return StatusOK
}

func (h *Host) recordMetric(id uint32, value uint64) Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, ok := h.metricIDs[id]
	if !ok {
		return StatusNotFound
	}
	switch m.typ {
	case metricCounter:
		m.value += int64(value)
	case metricGauge:
		m.value = int64(value)
	default:
		if len(m.samples) < maxHistogramSamples {
			m.samples = append(m.samples, value)
		}
	}
	return StatusOK
}

// Metric returns the value of the counter or gauge name (a counter first, if
// both exist) and whether it has been defined.
func (h *Host) Metric(name string) (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, typ := range []uint32{metricCounter, metricGauge} {
		if m, ok := h.metrics[metricKey{typ, name}]; ok {
			return m.value, true
		}
	}
	return 0, false
}

// Histogram returns the values recorded in the histogram name (at most the
// first 100000).
func (h *Host) Histogram(name string) []uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m, ok := h.metrics[metricKey{metricHistogram, name}]; ok {
		return append([]uint64(nil), m.samples...)
	}
	return nil
}

// Metrics returns the names of all defined metrics, sorted.
func (h *Host) Metrics() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	names := make([]string, 0, len(h.metrics))
	for k := range h.metrics {
		names = append(names, k.name)
	}
	sort.Strings(names)
	return names
}

// maxLogs bounds the retained log to its newest entries.
const maxLogs = 100000

func (h *Host) log(e LogEntry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.logs) >= maxLogs {
		h.logs = append(h.logs[:0], h.logs[len(h.logs)-maxLogs+1:]...)
	}
	h.logs = append(h.logs, e)
}

// Logs returns a copy of the retained log entries, oldest first.
func (h *Host) Logs() []LogEntry {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]LogEntry(nil), h.logs...)
}

// LogsAtLeast returns the retained entries at level min or above.
func (h *Host) LogsAtLeast(min LogLevel) []LogEntry {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []LogEntry
	for _, e := range h.logs {
		if e.Level >= min {
			out = append(out, e)
		}
	}
	return out
}

// engine is a wazero runtime holding one compiled module, the WASI host
// module and the env host module whose functions dispatch to the calling VM
// through the context.
type engine struct {
	rt       wazero.Runtime
	compiled wazero.CompiledModule
}

var engines struct {
	mu sync.Mutex
	m  map[[sha256.Size]byte]*engine
}

func loadEngine(ctx context.Context, wasm []byte) (*engine, error) {
	sum := sha256.Sum256(wasm)
	engines.mu.Lock()
	defer engines.mu.Unlock()
	if e, ok := engines.m[sum]; ok {
		return e, nil
	}
	// The runtime outlives ctx: it is cached for the process.
	bg := context.WithoutCancel(ctx)
	cfg := wazero.NewRuntimeConfig()
	if dir := cacheDir(); dir != "" {
		if cache, err := wazero.NewCompilationCacheWithDir(dir); err == nil {
			cfg = cfg.WithCompilationCache(cache)
		}
	}
	rt := wazero.NewRuntimeWithConfig(bg, cfg)
	compiled, err := rt.CompileModule(bg, wasm)
	if err != nil {
		rt.Close(bg)
		return nil, fmt.Errorf("wasmhost: compiling module: %w", err)
	}
	if err := checkModule(compiled); err != nil {
		rt.Close(bg)
		return nil, err
	}
	if _, err := wasi_snapshot_preview1.Instantiate(bg, rt); err != nil {
		rt.Close(bg)
		return nil, fmt.Errorf("wasmhost: instantiating wasi: %w", err)
	}
	if err := instantiateEnv(bg, rt, compiled.ImportedFunctions()); err != nil {
		rt.Close(bg)
		return nil, err
	}
	e := &engine{rt: rt, compiled: compiled}
	if engines.m == nil {
		engines.m = make(map[[sha256.Size]byte]*engine)
	}
	engines.m[sum] = e
	return e, nil
}

// CacheDirEnv names the environment variable that sets the directory of
// wazero's compilation cache, which keeps compiled code across processes
// (compiling a Go-built module takes seconds, over a minute under -race).
// Unset, the cache is in the user's cache directory (os.UserCacheDir); set
// to the empty string, there is no file cache. Entries are keyed by the
// module's content, in a subdirectory per wazero version.
const CacheDirEnv = "WASMHOST_CACHE_DIR"

func cacheDir() string {
	dir, explicit := os.LookupEnv(CacheDirEnv)
	if !explicit {
		base, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(base, "tokenbucket-wasmhost")
	}
	if dir == "" {
		return ""
	}
	v := wazeroVersion()
	if v == "" {
		if explicit {
			return dir
		}
		return "" // without a version, an upgrade could load stale code
	}
	return filepath.Join(dir, "wazero-"+v)
}

// wazeroVersion returns wazero's module version, read from the source path
// compiled into the binary (…/github.com/tetratelabs/wazero@v1.12.0/…), or
// "" if that path carries none (a vendored or replaced wazero). wazero cannot
// tell its own version in a test binary, which has no dependency build info,
// so its cache would not separate versions by itself.
func wazeroVersion() string {
	f := runtime.FuncForPC(reflect.ValueOf(wazero.NewRuntimeConfig).Pointer())
	if f == nil {
		return ""
	}
	file, _ := f.FileLine(f.Entry())
	_, after, ok := strings.Cut(file, "github.com/tetratelabs/wazero@")
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(after, "/")
	return v
}

// requiredExports are the guest functions the host needs. The other
// callbacks (proxy_on_response_body, proxy_on_http_call_response,
// proxy_on_tick, proxy_on_log, proxy_on_done) are optional, as in
// proxy-wasm-cpp-host: a missing one is skipped (see VM.call).
var requiredExports = []string{
	"_initialize", "proxy_abi_version_0_2_0", "proxy_on_memory_allocate",
	"proxy_on_context_create", "proxy_on_vm_start", "proxy_on_configure",
	"proxy_on_request_headers", "proxy_on_response_headers", "proxy_on_delete",
}

func checkModule(c wazero.CompiledModule) error {
	exports := c.ExportedFunctions()
	for _, name := range requiredExports {
		if _, ok := exports[name]; !ok {
			return fmt.Errorf("wasmhost: module: missing export %s (not a proxy-wasm 0.2.0 reactor?)", name)
		}
	}
	for _, f := range c.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod != "env" && mod != wasi_snapshot_preview1.ModuleName {
			return fmt.Errorf("wasmhost: module: import %s.%s: unknown module", mod, name)
		}
	}
	return nil
}
