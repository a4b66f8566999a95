package engine

import (
	"errors"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

// fakeHost is a Host for the engine's unit tests: a clock the test sets,
// Envoy's shared data (with a hook to lose compare-and-swaps), counters and
// logs it keeps, and callouts it holds until the test answers them.
type fakeHost struct {
	now      int64
	sd       SharedData
	counters map[string]*fakeCounter
	logs     []string
	warns    int         // how many of logs are warnings
	calls    []*fakeCall // the plugin's own
	// atOnce, when set, answers each of the plugin's calls within Callout
	// (a host that delivers an answer before the call is handed off).
	atOnce *Answer
}

type fakeCounter struct{ n int64 }

func (c *fakeCounter) Increment(n uint64) { c.n += int64(n) }
func (c *fakeCounter) Add(n int64)        { c.n += n }

type fakeCall struct {
	call   *Call
	answer func(*Answer)
}

func newFakeHost() *fakeHost {
	return &fakeHost{now: 1_000e9, sd: shareddata.New(), counters: map[string]*fakeCounter{}}
}

func (h *fakeHost) Now() int64                  { return h.now }
func (h *fakeHost) SharedData() SharedData      { return h.sd }
func (h *fakeHost) Counter(name string) Counter { return h.metric(name) }
func (h *fakeHost) Gauge(name string) Gauge     { return h.metric(name) }
func (h *fakeHost) Log(level LogLevel, msg string) {
	h.logs = append(h.logs, msg)
	if level == LogWarn {
		h.warns++
	}
}

func (h *fakeHost) metric(name string) *fakeCounter {
	c, ok := h.counters[name]
	if !ok {
		c = &fakeCounter{}
		h.counters[name] = c
	}
	return c
}

func (h *fakeHost) Callout(call *Call, answer func(*Answer)) error {
	if h.atOnce != nil {
		answer(h.atOnce)
		return nil
	}
	h.calls = append(h.calls, &fakeCall{call, answer})
	return nil
}

func (h *fakeHost) count(name string) int64 { return h.metric(Name + "." + name).n }

// defined reports whether the engine defined a metric name (the host shows
// every metric defined, even at zero).
func (h *fakeHost) defined(name string) bool { _, ok := h.counters[Name+"."+name]; return ok }

// fakeStream is one request: its headers, what the engine did to it, and
// the calls it owns.
type fakeStream struct {
	req map[string]string
	// more are further request headers, after req's, whose names may repeat
	// (a second Cookie header): RequestHeaders lists them, RequestHeader
	// does not see them.
	more  [][2]string
	props map[string]string // properties by dotted path, beside source.address
	resp  map[string]string
	added [][2]string
	// The local reply: its status (0 while none), headers and body.
	replied      int
	replyHeaders [][2]string
	replyBody    string
	replyErr     error
	bodyRead     int    // bytes of the response body the engine read
	action       Action // what OnRequestHeaders returned (world.open)
	resumed      int
	calls        []*fakeCall
	body         []byte // the response body's current chunk
	reqChunk     []byte // the request body's current chunk
	reqRead      int    // bytes of the request body the engine read
	// done: the request is gone (reset, or answered): the host drops the
	// answers of its calls and runs nothing more for it.
	done bool
	// deferRun holds what Run is asked to run until the test runs it
	// (runDeferred), as a host whose answer arrives on another thread
	// does; otherwise Run runs it at once.
	deferRun bool
	deferred []func()
	// timers are the engine's holds (After), each run once by fire; clock
	// is the host's (nil: 0); noTimer makes After fail.
	timers  []*fakeTimer
	clock   *int64
	noTimer bool
}

type fakeTimer struct {
	due   int64
	f     func()
	fired bool
}

// After holds f until fire reaches due.
func (s *fakeStream) After(delay int64, f func()) error {
	switch {
	case s.done:
		return errors.New("fake: the request is gone")
	case s.noTimer:
		return errors.New("fake: no timer")
	}
	now := int64(0)
	if s.clock != nil {
		now = *s.clock
	}
	s.timers = append(s.timers, &fakeTimer{due: now + delay, f: f})
	return nil
}

// fire runs, once each, the timers due by now, unless the request is gone
// (the host drops them). It returns how many ran.
func (s *fakeStream) fire(now int64) int {
	n := 0
	for _, t := range s.timers {
		if !t.fired && t.due <= now && !s.done {
			t.fired = true
			n++
			t.f()
		}
	}
	return n
}

// newFakeStream is a GET / with the headers (name/value pairs); a
// pseudo-header given replaces the default (or the one given before), any
// other name given twice is a repeated header.
func newFakeStream(kv ...string) *fakeStream {
	s := &fakeStream{req: map[string]string{":method": "GET", ":path": "/", ":authority": "example"}, resp: map[string]string{}}
	seen := map[string]bool{}
	for i := 0; i+1 < len(kv); i += 2 {
		if seen[kv[i]] && !strings.HasPrefix(kv[i], ":") { // a header repeated
			s.more = append(s.more, [2]string{kv[i], kv[i+1]})
			continue
		}
		seen[kv[i]] = true
		s.req[kv[i]] = kv[i+1]
	}
	return s
}

func (s *fakeStream) RequestHeader(name string) (string, bool) { v, ok := s.req[name]; return v, ok }
func (s *fakeStream) RequestHeaders() [][2]string {
	var hs [][2]string
	for k, v := range s.req {
		hs = append(hs, [2]string{k, v})
	}
	return append(hs, s.more...)
}
func (s *fakeStream) Property(path ...string) ([]byte, bool) {
	p := strings.Join(path, ".")
	if v, ok := s.props[p]; ok {
		return []byte(v), true
	}
	if p == "source.address" {
		return []byte("10.0.0.1:4242"), true
	}
	return nil, false
}
func (s *fakeStream) ReplaceRequestHeader(name, value string) error { s.req[name] = value; return nil }
func (s *fakeStream) ResponseHeader(name string) (string, bool)     { v, ok := s.resp[name]; return v, ok }
func (s *fakeStream) AddResponseHeader(name, value string) error {
	s.added = append(s.added, [2]string{name, strings.Clone(value)})
	return nil
}
func (s *fakeStream) ResponseBody(off, size int) ([]byte, error) {
	if off < 0 || size < 0 || off+size > len(s.body) {
		return nil, errors.New("no such body bytes")
	}
	s.bodyRead += size
	return s.body[off : off+size], nil
}
func (s *fakeStream) RequestBody(off, size int) ([]byte, error) {
	if off < 0 || size < 0 || off+size > len(s.reqChunk) {
		return nil, errors.New("no such body bytes")
	}
	s.reqRead += size
	return s.reqChunk[off : off+size], nil
}
func (s *fakeStream) SendReply(status int, headers [][2]string, body []byte) error {
	if s.replyErr != nil {
		return s.replyErr
	}
	s.replied, s.replyHeaders, s.replyBody = status, headers, string(body)
	return nil
}
func (s *fakeStream) Resume() error { s.resumed++; return nil }
func (s *fakeStream) Run(f func()) error {
	switch {
	case s.done:
		return errors.New("fake: the request is gone")
	case s.deferRun:
		s.deferred = append(s.deferred, f)
	default:
		f()
	}
	return nil
}

// runDeferred runs what Run deferred, unless the request is gone (the host
// drops it).
func (s *fakeStream) runDeferred() {
	fs := s.deferred
	s.deferred = nil
	for _, f := range fs {
		if !s.done {
			f()
		}
	}
}
func (s *fakeStream) Callout(call *Call, answer func(*Answer)) error {
	s.calls = append(s.calls, &fakeCall{call, answer})
	return nil
}

func newPlugin(t testing.TB, h *fakeHost, cfg string) *Plugin {
	t.Helper()
	p, err := New(h, []byte(cfg), "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const oneToken = `{"rules": [{"name": "one", "limit_keys": ["header:k"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}}]}`

const fleet = `{"service": {"cluster": "limitd", "failure_mode": "deny"}, "rules": [
  {"name": "local", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
  {"name": "fleet", "scope": "cluster", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 9}}]}`

const refused = `{"allowed":false,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":900,"reset_ms":900}]}`

// TestReplyThatCannotBeSentFailsOpen: the host refuses the 429; the request
// goes on, counted in failed_open, and nothing of it stays consumed.
func TestReplyThatCannotBeSentFailsOpen(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, oneToken)
	if a := p.NewRequest(newFakeStream("k", "a")).OnRequestHeaders(); a != Continue {
		t.Fatalf("first request: %v", a)
	}
	s := newFakeStream("k", "a")
	s.replyErr = errors.New("host: no reply")
	if a := p.NewRequest(s).OnRequestHeaders(); a != Continue || s.replied != 0 {
		t.Fatalf("a rejection the host cannot send: action %v, replied %d; want the request to go on", a, s.replied)
	}
	if h.count("rule.one.failed_open") != 1 || h.count("rule.one.rejected") != 0 {
		t.Fatalf("failed_open %d, rejected %d; want 1 and 0", h.count("rule.one.failed_open"), h.count("rule.one.rejected"))
	}
}

// TestReplyThatCannotBeSentResumes: the limit service refuses a paused
// request and the host cannot send the reply: the request is resumed, not
// left hanging, and the local rule's token is given back once.
func TestReplyThatCannotBeSentResumes(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, fleet)
	s := newFakeStream()
	s.replyErr = errors.New("host: no reply")
	if a := p.NewRequest(s).OnRequestHeaders(); a != Pause || len(s.calls) != 1 {
		t.Fatalf("action %v with %d calls; want a pause on one call", a, len(s.calls))
	}
	s.calls[0].answer(&Answer{Status: "200", Body: []byte(refused)})
	if s.resumed != 1 || s.replied != 0 || h.count("refunds") != 1 {
		t.Fatalf("resumed %d, replied %d, refunds %d; want 1, 0, 1", s.resumed, s.replied, h.count("refunds"))
	}
}

// lossy is shared data whose every bucket write loses its compare-and-swap
// (the placement seed and the identity key are written as usual).
type lossy struct{ slots.SharedData }

func (l lossy) Set(key string, value []byte, cas uint32) error {
	if key == SeedKey || key == IdentityKeyKey {
		return l.SharedData.Set(key, value, cas)
	}
	return slots.ErrCASMismatch
}

// failingData is shared data whose writes fail with fail while it is set
// (a host error, not a CAS mismatch); once: only the next write fails.
type failingData struct {
	slots.SharedData
	fail error
	once bool
}

func (f *failingData) Set(key string, value []byte, cas uint32) error {
	if err := f.fail; err != nil {
		if f.once {
			f.fail = nil
		}
		return err
	}
	return f.SharedData.Set(key, value, cas)
}

// TestCASStormFailsOpen: every write loses its compare-and-swap; after the
// bounded retries the request fails open, counted, with nothing written.
func TestCASStormFailsOpen(t *testing.T) {
	h := newFakeHost()
	h.sd = lossy{shareddata.New()}
	p := newPlugin(t, h, oneToken)
	for range 3 {
		if a := p.NewRequest(newFakeStream("k", "a")).OnRequestHeaders(); a != Continue {
			t.Fatalf("action %v under a CAS storm, want the request to go on", a)
		}
	}
	if h.count("rule.one.failed_open") != 3 || h.count("cas_retries") != 3*slots.MaxAttempts {
		t.Fatalf("failed_open %d, cas_retries %d; want 3 and %d", h.count("rule.one.failed_open"), h.count("cas_retries"), 3*slots.MaxAttempts)
	}
}

// TestLateAnswerAfterTheHostAnswered: the host answers a paused request
// itself (a stream timeout) before the limit service's refusal arrives:
// the refusal changes nothing of the request, and the local rule's token
// is not given back.
func TestLateAnswerAfterTheHostAnswered(t *testing.T) {
	h := newFakeHost()
	p := newPlugin(t, h, fleet)
	s := newFakeStream()
	r := p.NewRequest(s)
	r.OnRequestHeaders()
	s.resp[":status"] = "504"
	r.OnResponseHeaders(true)
	s.calls[0].answer(&Answer{Status: "200", Body: []byte(refused)})
	if s.replied != 0 || s.resumed != 0 || h.count("refunds") != 0 {
		t.Fatalf("replied %d, resumed %d, refunds %d; want nothing", s.replied, s.resumed, h.count("refunds"))
	}
}

// TestScriptedCalls: a failed call, an unusable answer and an admitting
// answer, each as the host delivers it.
func TestScriptedCalls(t *testing.T) {
	cases := []struct {
		name        string
		answer      *Answer
		wantReplied int
		wantResumed int
	}{
		{"no answer: failure_mode deny", &Answer{Failed: true}, 429, 0},
		{"status 503: deny", &Answer{Status: "503"}, 429, 0},
		{"too large: deny", &Answer{Status: "200", TooLarge: true}, 429, 0},
		{"admitted", &Answer{Status: "200", Body: []byte(`{"allowed":true,"buckets":[{"allowed":true,"remaining":8,"retry_after_ms":0,"reset_ms":1000}]}`)}, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newFakeHost()
			p := newPlugin(t, h, fleet)
			s := newFakeStream()
			p.NewRequest(s).OnRequestHeaders()
			s.calls[0].answer(c.answer)
			if s.replied != c.wantReplied || s.resumed != c.wantResumed {
				t.Fatalf("replied %d, resumed %d; want %d, %d", s.replied, s.resumed, c.wantReplied, c.wantResumed)
			}
			if c.wantReplied != 0 && h.count("refunds") != 1 {
				t.Fatalf("refunds %d after a rejection: want the local token back", h.count("refunds"))
			}
		})
	}
}
