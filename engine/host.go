package engine

import (
	"runtime"

	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
)

// Host is what the engine needs from the proxy for the whole plugin.
type Host interface {
	// Now is the wall clock in Unix nanoseconds, the same for every worker.
	Now() int64
	// SharedData is the proxy's shared key/value store (every worker's),
	// with Envoy's compare-and-swap semantics.
	SharedData() SharedData
	// Counter and Gauge define a metric by name (at configuration time).
	Counter(name string) Counter
	Gauge(name string) Gauge
	// Log writes one line at level.
	Log(level LogLevel, msg string)
	// Callout sends an HTTP call owned by the plugin: its answer is
	// delivered whatever becomes of the request that caused it.
	Callout(call *Call, answer func(*Answer)) error
}

// SharedData is the proxy's shared key/value store with Envoy's semantics
// (proxy-wasm-cpp-host's SharedData): Get returns a key's value and CAS, or
// ErrNotFound for a missing key; Set fails with ErrCASMismatch only when the
// key exists, cas != 0 and cas differs from the key's current CAS (a set on
// a missing key always succeeds); every successful Set gives the key the
// next value of one process-wide counter as its CAS. There is no delete.
type SharedData interface {
	Get(key string) (value []byte, cas uint32, err error)
	Set(key string, value []byte, cas uint32) error
}

// The errors a SharedData returns for a missing key and a lost
// compare-and-swap (the engine's tables compare with errors.Is).
var (
	ErrNotFound    = slots.ErrNotFound
	ErrCASMismatch = slots.ErrCASMismatch
)

// DrawNumber draws the next number of the counter stored in sd under key:
// 1, then 2, and so on, each number to one caller only, whichever worker
// draws it (slots.Next: a bounded CAS loop; it fails having drawn nothing
// when it keeps losing). A host numbers what must differ between workers
// with it (the Wasm plugin's shared queues).
func DrawNumber(sd SharedData, key string) (uint64, error) { return slots.Next(sd, key) }

// Stream is one request as the host offers it. Its methods act on that
// request only.
type Stream interface {
	RequestHeader(name string) (string, bool)
	// RequestHeaders are all the request's headers (names lower case).
	RequestHeaders() [][2]string
	// Property is the host's property at path (source address, metadata).
	Property(path ...string) ([]byte, bool)
	ReplaceRequestHeader(name, value string) error
	ResponseHeader(name string) (string, bool)
	// AddResponseHeader adds a header to the response. value is valid only
	// during the call (it may alias the engine's scratch buffer): a host
	// that keeps it must copy it.
	AddResponseHeader(name, value string) error
	// ResponseBody reads size bytes of the response body's current chunk
	// from offset. They are valid only until the next call or the end of
	// the body callback (they may be the host's own memory): the engine
	// scans them and keeps none.
	ResponseBody(offset, size int) ([]byte, error)
	// RequestBody reads size bytes from offset of the request body's chunk
	// the current OnRequestBody received (offset 0: its first byte), on
	// the same terms as ResponseBody.
	RequestBody(offset, size int) ([]byte, error)
	// SendReply answers the request with a local reply.
	SendReply(status int, headers [][2]string, body []byte) error
	// Resume goes on with a request the engine paused.
	Resume() error
	// Callout sends an HTTP call owned by this request: its answer is
	// dropped when the request is gone.
	Callout(call *Call, answer func(*Answer)) error
	// After runs f once as part of this request, the Stream's methods
	// acting on it, no sooner than delay nanoseconds of the host's clock
	// (Host.Now) from the call: the engine holds a request short of tokens
	// (max_delay_ms) and goes on with it from f. The host drops f once the
	// request is done (Request.Done gives back what the held request took);
	// it returns an error when it cannot set the timer, and then never runs
	// f. A host may run f late (its timers' resolution, a busy thread),
	// never early, and never twice.
	After(delay int64, f func()) error
	// Run runs f as part of this request, the Stream's methods acting on
	// it, for an answer that arrived outside the request's callbacks (a
	// call the plugin owns): at once if the host can act on the request
	// from where the caller runs, else soon, from the request's thread.
	// The host drops f once the request is done (Request.Done settles what
	// f would have), and returns an error when it cannot run f at all.
	Run(f func()) error
}

// Action is what the host does with a request after a callback: go on, or
// hold it (the engine answered it, or waits for a call).
type Action uint8

const (
	Continue Action = iota
	Pause
)

// Counter and Gauge are metrics the host keeps (shown in Envoy's /stats).
type (
	Counter interface{ Increment(n uint64) }
	Gauge   interface{ Add(n int64) }
)

// LogLevel is a log line's level.
type LogLevel uint8

const (
	LogInfo LogLevel = iota
	LogWarn
	LogCritical
)

// Call is an HTTP call to a cluster of the proxy.
type Call struct {
	Cluster   string
	Headers   [][2]string
	Body      []byte
	TimeoutMS uint32
	// MaxBody bounds the answer's body the host reads (a larger one is
	// TooLarge, unread).
	MaxBody int
}

// Answer is what came back from a Call.
type Answer struct {
	Failed   bool   // no answer: reset, no cluster (Envoy answers a timeout 504, a Status)
	Status   string // ":status"
	Body     []byte // the body, unless TooLarge or Err
	TooLarge bool   // the body was larger than Call.MaxBody
	Err      error  // reading the answer failed
}

// Handler is what a host drives for one request, callback by callback: a
// *Request, or, in the host-contract suite's builds, the suite's driver in
// its place (internal/testing/hostcontract).
type Handler interface {
	OnRequestHeaders() Action
	// OnRequestHeadersWithBody is OnRequestHeaders for headers a body
	// follows, when the configuration reads request bodies
	// (Configuration.ReadsRequestBody); then OnRequestBody and
	// OnRequestTrailers come with the body.
	OnRequestHeadersWithBody() Action
	OnRequestBody(size int, endOfStream bool) Action
	OnRequestTrailers() Action
	OnResponseHeaders(endOfStream bool) Action
	OnResponseBody(size int, endOfStream bool) Action
	OnResponseTrailers() Action
	Done()
}

// App is what a host runs on a worker: requests, each a Handler, and the
// once-a-second Tick. PluginApp is a Plugin as an App; in the host-contract
// suite's builds the suite's driver runs in its place.
type App interface {
	NewRequest(Stream) Handler
	Tick(*runtime.MemStats)
}

// PluginApp is a Plugin as an App: its NewRequest's Request as a Handler.
type PluginApp struct{ *Plugin }

// NewRequest is Plugin.NewRequest.
func (a PluginApp) NewRequest(s Stream) Handler { return a.Plugin.NewRequest(s) }

var (
	_ Handler = (*Request)(nil)
	_ App     = PluginApp{}
)
