// Package fakehost is a host for the engine in process (engine.Host,
// engine.Stream), for tests: a clock the test sets, Envoy's shared data
// (package shareddata; RefusingData makes its writes fail),
// counters and logs it keeps, callouts it holds until the test answers
// them, and the engine's holds (After) and, with DeferRun, its runs (Run),
// kept until the test fires or runs them. Nothing runs unless the test
// makes it run, so a test states a request and what the host sees, step by
// step. The host contract (package hostcontract) runs on it, and so do the
// engine's behaviour tests: it is the one fake host (internal/lint keeps it
// so).
//
// A Host and its Streams are one worker's: not safe for concurrent use;
// Clock and the shared data may be shared by several.
package fakehost

import (
	"errors"
	"strings"
	"sync/atomic"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

// Clock is a wall clock in Unix ns that moves only when set. Safe for
// concurrent use.
type Clock struct{ ns atomic.Int64 }

// NewClock returns a Clock at ns.
func NewClock(ns int64) *Clock {
	c := &Clock{}
	c.ns.Store(ns)
	return c
}

func (c *Clock) Now() int64            { return c.ns.Load() }
func (c *Clock) Set(ns int64)          { c.ns.Store(ns) }
func (c *Clock) Advance(d int64) int64 { return c.ns.Add(d) }

// Host is engine.Host.
type Host struct {
	Clock    *Clock
	SD       engine.SharedData
	Counters map[string]*Counter
	Logs     []string
	Warns    int // how many of Logs are warnings
	// Calls are the plugin's calls not yet answered (Answer them).
	Calls []*Call
	// AtOnce, when set, answers each of the plugin's calls within Callout
	// (a host that delivers an answer before the call is handed off).
	AtOnce *engine.Answer
}

// Counter is a counter or gauge the Host keeps.
type Counter struct{ N int64 }

func (c *Counter) Increment(n uint64) { c.N += int64(n) }
func (c *Counter) Add(n int64)        { c.N += n }

// Call is a call the host holds until the test answers it.
type Call struct {
	Call   *engine.Call
	Answer func(*engine.Answer)
}

// New returns a Host at 1,000 s past the epoch with empty shared data.
func New() *Host {
	return &Host{Clock: NewClock(1_000e9), SD: shareddata.New(), Counters: map[string]*Counter{}}
}

func (h *Host) Now() int64                         { return h.Clock.Now() }
func (h *Host) SharedData() engine.SharedData      { return h.SD }
func (h *Host) Counter(name string) engine.Counter { return h.Metric(name) }
func (h *Host) Gauge(name string) engine.Gauge     { return h.Metric(name) }

// Log keeps msg in Logs, and counts a warning in Warns.
func (h *Host) Log(level engine.LogLevel, msg string) {
	h.Logs = append(h.Logs, msg)
	if level == engine.LogWarn {
		h.Warns++
	}
}

// Count is the value of the engine's metric name (without the
// engine.Name prefix), 0 when it is not defined.
func (h *Host) Count(name string) int64 {
	if c, ok := h.Counters[engine.Name+"."+name]; ok {
		return c.N
	}
	return 0
}

// Defined reports whether the engine defined its metric name (without the
// engine.Name prefix): a host shows every metric defined, even at zero.
func (h *Host) Defined(name string) bool { _, ok := h.Counters[engine.Name+"."+name]; return ok }

// Metric is the counter or gauge name, created at 0.
func (h *Host) Metric(name string) *Counter {
	c, ok := h.Counters[name]
	if !ok {
		c = &Counter{}
		h.Counters[name] = c
	}
	return c
}

// Callout holds the call in Calls (or answers AtOnce).
func (h *Host) Callout(call *engine.Call, answer func(*engine.Answer)) error {
	if h.AtOnce != nil {
		answer(h.AtOnce)
		return nil
	}
	h.Calls = append(h.Calls, &Call{call, answer})
	return nil
}

// TakeCalls returns the plugin's calls held and forgets them.
func (h *Host) TakeCalls() []*Call {
	cs := h.Calls
	h.Calls = nil
	return cs
}

// Stream is engine.Stream: one request's headers, what the engine did to
// it, and the calls it owns.
type Stream struct {
	Req, Resp map[string]string
	// More are further request headers, after Req's, whose names may
	// repeat (a second Cookie header): RequestHeaders lists them,
	// RequestHeader does not see them.
	More [][2]string
	// Props are the host's properties by dotted path (Property), beside
	// source.address, which is 10.0.0.1:4242 unless Props gives it.
	Props map[string]string
	Added [][2]string // response headers the engine added
	// Replied is the local reply's status, 0 while none; ReplyHeaders and
	// ReplyBody are what came with it. ReplyErr makes SendReply fail.
	Replied      int
	ReplyHeaders [][2]string
	ReplyBody    []byte
	ReplyErr     error
	Resumed      int
	Calls        []*Call // the request's calls not yet answered
	Body         []byte  // the response body's current chunk
	ReqBody      []byte  // the request body's current chunk
	BodyRead     int     // bytes of the response body the engine read
	ReqBodyRead  int     // bytes of the request body the engine read
	// Done: the request is gone (reset, or answered): Run refuses, and a
	// test drops the answers of its calls.
	Done bool
	// DeferRun holds what Run is asked to run until RunDeferred, as a host
	// whose answer arrives on another thread does; otherwise Run runs it
	// at once.
	DeferRun bool
	Deferred []func()
	// Timers are the engine's holds (After), each run once by Fire at or
	// after its moment on Clock (nil: moments count from 0). NoTimer
	// makes After fail, as a host that cannot set a timer.
	Timers  []*Timer
	Clock   *Clock
	NoTimer bool
}

// Timer is one hold of a Stream.
type Timer struct {
	Due   int64
	F     func()
	Fired bool
}

// After holds f until Fire reaches due.
func (s *Stream) After(delay int64, f func()) error {
	switch {
	case s.Done:
		return errGone
	case s.NoTimer:
		return errNoTimer
	}
	now := int64(0)
	if s.Clock != nil {
		now = s.Clock.Now()
	}
	s.Timers = append(s.Timers, &Timer{Due: now + delay, F: f})
	return nil
}

// Fire runs, once each, the holds due by now, unless the request is gone.
// It returns how many ran.
func (s *Stream) Fire(now int64) int {
	n := 0
	for _, t := range s.Timers {
		if !t.Fired && t.Due <= now && !s.Done {
			t.Fired = true
			n++
			t.F()
		}
	}
	return n
}

// NewStream returns a GET / to authority "example" with the headers kv
// (name, value, ...): a pseudo-header given replaces the default (or the
// one given before), any other name given twice is a repeated header
// (in More).
func NewStream(kv ...string) *Stream {
	s := &Stream{Req: map[string]string{":method": "GET", ":path": "/", ":authority": "example"}, Resp: map[string]string{}}
	seen := map[string]bool{}
	for i := 0; i+1 < len(kv); i += 2 {
		if seen[kv[i]] && !strings.HasPrefix(kv[i], ":") {
			s.More = append(s.More, [2]string{kv[i], kv[i+1]})
			continue
		}
		seen[kv[i]] = true
		s.Req[kv[i]] = kv[i+1]
	}
	return s
}

func (s *Stream) RequestHeader(name string) (string, bool) { v, ok := s.Req[name]; return v, ok }

func (s *Stream) RequestHeaders() [][2]string {
	var hs [][2]string
	for k, v := range s.Req {
		hs = append(hs, [2]string{k, v})
	}
	return append(hs, s.More...)
}

func (s *Stream) Property(path ...string) ([]byte, bool) {
	p := strings.Join(path, ".")
	if v, ok := s.Props[p]; ok {
		return []byte(v), true
	}
	if p == "source.address" {
		return []byte("10.0.0.1:4242"), true
	}
	return nil, false
}

func (s *Stream) ReplaceRequestHeader(name, value string) error { s.Req[name] = value; return nil }
func (s *Stream) ResponseHeader(name string) (string, bool)     { v, ok := s.Resp[name]; return v, ok }

// AddResponseHeader keeps a copy of value (the engine lends it).
func (s *Stream) AddResponseHeader(name, value string) error {
	s.Added = append(s.Added, [2]string{name, strings.Clone(value)})
	return nil
}

var errNoBody = errors.New("fakehost: no such body bytes")

func (s *Stream) ResponseBody(off, size int) ([]byte, error) {
	if off < 0 || size < 0 || off+size > len(s.Body) {
		return nil, errNoBody
	}
	s.BodyRead += size
	return s.Body[off : off+size], nil
}

func (s *Stream) RequestBody(off, size int) ([]byte, error) {
	if off < 0 || size < 0 || off+size > len(s.ReqBody) {
		return nil, errNoBody
	}
	s.ReqBodyRead += size
	return s.ReqBody[off : off+size], nil
}

func (s *Stream) SendReply(status int, headers [][2]string, body []byte) error {
	if s.ReplyErr != nil {
		return s.ReplyErr
	}
	s.Replied, s.ReplyHeaders, s.ReplyBody = status, headers, append([]byte(nil), body...)
	return nil
}

func (s *Stream) Resume() error { s.Resumed++; return nil }

var (
	errGone    = errors.New("fakehost: the request is gone")
	errNoTimer = errors.New("fakehost: no timer")
)

func (s *Stream) Run(f func()) error {
	switch {
	case s.Done:
		return errGone
	case s.DeferRun:
		s.Deferred = append(s.Deferred, f)
	default:
		f()
	}
	return nil
}

// RunDeferred runs what Run deferred, unless the request is gone (the host
// drops it).
func (s *Stream) RunDeferred() {
	fs := s.Deferred
	s.Deferred = nil
	for _, f := range fs {
		if !s.Done {
			f()
		}
	}
}

// Callout holds the call in Calls.
func (s *Stream) Callout(call *engine.Call, answer func(*engine.Answer)) error {
	s.Calls = append(s.Calls, &Call{call, answer})
	return nil
}

// TakeCalls returns the request's calls held and forgets them.
func (s *Stream) TakeCalls() []*Call {
	cs := s.Calls
	s.Calls = nil
	return cs
}

var (
	_ engine.Host   = (*Host)(nil)
	_ engine.Stream = (*Stream)(nil)
)
