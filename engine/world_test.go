package engine_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
	"github.com/ratelimit-wasm/tokenbucket/service"
)

// The behaviour tests drive a Plugin on the fake host (package fakehost,
// the host the host contract checks) as Envoy drives it: a
// request's headers, then (when the plugin lets it go on) the upstream's
// response, its body in chunks, and the end of the request. Each table
// states requests and what the host sees of them: the status and headers
// the client gets, the calls the plugin made, the metrics and log lines.

const sec = int64(1e9)

// stream is a request on the fake host, and what OnRequestHeaders
// returned for it (world.open).
type stream struct {
	*fakehost.Stream
	action engine.Action
}

// newStream is a GET / with the headers (fakehost.NewStream).
func newStream(kv ...string) *stream { return &stream{Stream: fakehost.NewStream(kv...)} }

func newPlugin(t testing.TB, h *fakehost.Host, cfg string) *engine.Plugin {
	t.Helper()
	p, err := engine.New(h, []byte(cfg), "", engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// world is one plugin on the fake host, and optionally a limit service
// answering its calls.
type world struct {
	t      testing.TB
	h      *fakehost.Host
	p      *engine.Plugin
	limitd *limitd
	props  map[string]string // the properties every request has
}

func newWorld(t testing.TB, cfg string) *world { t.Helper(); return newWorldOn(t, fakehost.New(), cfg) }

// newWorldOn is a world on a host the test prepared (its shared data).
func newWorldOn(t testing.TB, h *fakehost.Host, cfg string) *world {
	t.Helper()
	return &world{t: t, h: h, p: newPlugin(t, h, cfg)}
}

// upstream is what the upstream answers: a status (none: "200"), headers,
// the body in chunks (none: a response without a body), and how it ends.
type upstream struct {
	status   string
	headers  [][2]string
	chunks   []string
	trailers bool // trailers follow the last chunk
	cut      bool // the stream ends before the body's end (client gone, reset)
}

// seen is what the client saw of one request, and what the host did for it.
type seen struct {
	status  int
	headers map[string]string // the local reply's, or those added to the upstream's response
	body    string            // the local reply's
	calls   int               // calls answered while the request ran (by the limit service)
	stream  *stream
}

// do runs one request with the headers (name/value pairs) through the
// plugin and, when it goes on, a 200 without a body.
func (w *world) do(headers ...string) seen { return w.doUpstream(upstream{}, headers...) }

// doUpstream runs one request and, when it goes on, the upstream's answer.
func (w *world) doUpstream(up upstream, headers ...string) seen {
	w.t.Helper()
	s, r := w.open(headers...)
	got := seen{headers: map[string]string{}, stream: s}
	if w.limitd != nil {
		got.calls = w.limitd.serve(s)
	}
	if s.Replied != 0 {
		got.status, got.body = s.Replied, string(s.ReplyBody)
		for _, h := range s.ReplyHeaders {
			got.headers[h[0]] = h[1]
		}
		// The local reply passes the response callbacks: nothing is added.
		s.Resp = got.headers
		r.OnResponseHeaders(false)
		if len(s.Added) != 0 {
			w.t.Fatalf("the local reply's headers were added to: %v", s.Added)
		}
		w.end(s, r)
		return got
	}
	if s.paused() {
		w.t.Fatalf("request neither answered nor continued (resumed %d)", s.Resumed)
	}
	got.status = 200
	w.respond(s, r, up)
	for _, h := range s.Added {
		if _, dup := got.headers[h[0]]; dup {
			w.t.Fatalf("header %s added twice", h[0])
		}
		got.headers[h[0]] = h[1]
	}
	w.end(s, r)
	return got
}

// open starts a request: its headers, decided.
func (w *world) open(headers ...string) (*stream, *engine.Request) {
	s := newStream(headers...)
	s.Props = w.props
	s.Clock = w.h.Clock
	r := w.p.NewRequest(s)
	s.action = r.OnRequestHeaders()
	return s, r
}

// respond passes the upstream's response to a request that went on: its
// headers, then its body chunk by chunk (no chunk may be held), then its
// trailers; the limit service answers what the response calls for.
func (w *world) respond(s *stream, r *engine.Request, up upstream) {
	w.t.Helper()
	if up.status == "" {
		up.status = "200"
	}
	s.Resp = map[string]string{":status": up.status}
	for _, h := range up.headers {
		s.Resp[h[0]] = h[1]
	}
	r.OnResponseHeaders(len(up.chunks) == 0 && !up.trailers && !up.cut)
	for i, ch := range up.chunks {
		s.Body = []byte(ch)
		end := i == len(up.chunks)-1 && !up.trailers && !up.cut
		if a := r.OnResponseBody(len(ch), end); a != engine.Continue {
			w.t.Fatalf("body chunk %d: action %v, want continue", i, a)
		}
	}
	if up.trailers {
		r.OnResponseTrailers()
	}
}

// end ends a request (after its response, or cut short): the limit service
// answers what it sent.
func (w *world) end(s *stream, r *engine.Request) {
	s.Done = true
	r.Done()
	if w.limitd != nil {
		w.limitd.serve(s)
	}
}

// statuses sends n requests with the headers and returns their statuses.
func (w *world) statuses(n int, headers ...string) []int {
	w.t.Helper()
	out := make([]int, n)
	for i := range out {
		out[i] = w.do(headers...).status
	}
	return out
}

// tick is the plugin's once-a-second work, the limit service answering
// what it sends.
func (w *world) tick() {
	w.p.Tick(&runtime.MemStats{})
	if w.limitd != nil {
		w.limitd.serve()
	}
}

func (w *world) count(name string) int64 { return w.h.Count(name) }

// paused: the request waits (it was paused and neither resumed nor
// answered).
func (s *stream) paused() bool {
	return s.action == engine.Pause && s.Resumed == 0 && s.Replied == 0
}

// limitd is a real limit service (service.Server on a memory store on the
// fake host's clock) that answers the plugin's calls.
type limitd struct {
	h      *fakehost.Host
	srv    http.Handler
	served map[*fakehost.Stream]int // calls answered per owner (nil: the plugin)
	calls  int                      // calls answered in all
	down   bool                     // answer every call with a failure
}

// withLimitd gives the world a limit service.
func (w *world) withLimitd() *world {
	srv, err := service.NewServer(service.Config{Store: service.NewMemoryStore(service.MemoryOptions{Now: w.h.Now})})
	if err != nil {
		w.t.Fatal(err)
	}
	w.limitd = &limitd{h: w.h, srv: srv, served: map[*fakehost.Stream]int{}}
	return w
}

// serve answers every unanswered call of the streams and of the plugin,
// until none is left (an answer may send another call); it returns how
// many it answered. A stream's calls are answered only while the request
// lives (the host drops them after).
func (l *limitd) serve(streams ...*stream) int {
	owners := []*fakehost.Stream{nil} // nil: the plugin
	for _, s := range streams {
		owners = append(owners, s.Stream)
	}
	n := 0
	for more := true; more; {
		more = false
		for _, s := range owners {
			for l.served[s] < len(l.callsOf(s)) {
				c := l.callsOf(s)[l.served[s]]
				l.served[s]++
				more = true
				if s == nil || !s.Done { // the host drops a gone request's answers
					n++
					l.calls++
					c.Answer(l.answer(c.Call))
				}
			}
		}
	}
	return n
}

// callsOf are the calls s sent (nil: the plugin).
func (l *limitd) callsOf(s *fakehost.Stream) []*fakehost.Call {
	if s == nil {
		return l.h.Calls
	}
	return s.Calls
}

func (l *limitd) answer(c *engine.Call) *engine.Answer {
	if l.down {
		return &engine.Answer{Failed: true}
	}
	hs := map[string]string{}
	for _, h := range c.Headers {
		hs[h[0]] = h[1]
	}
	r := httptest.NewRequest(hs[":method"], hs[":path"], bytes.NewReader(c.Body))
	rec := httptest.NewRecorder()
	l.srv.ServeHTTP(rec, r)
	return &engine.Answer{Status: "200", Body: rec.Body.Bytes()}
}

// timeline is a behaviour's case: a configuration, then requests in order,
// each with what the client must see; then the metrics.
type timeline struct {
	name    string
	cfg     string
	limitd  bool              // a limit service answers the calls
	down    bool              // it fails every call
	props   map[string]string // the properties every request has (dotted paths)
	steps   []exchange
	metrics map[string]int64 // metric (without the tokenbucket. prefix) → value after the steps
}

// exchange is one request (or times requests alike) at a moment, and what the
// client sees.
type exchange struct {
	wait    int64 // nanoseconds the clock moves before the request
	times   int   // the request is sent this many times (0: once)
	req     []string
	up      upstream
	status  int               // 0: not checked
	headers map[string]string // each as given ("": absent; "a|b": a or b)
	body    string            // a part of the reply's body
	calls   int               // the limit service answered this many calls for it (0: not checked)
	noCall  bool              // it answered none
}

// run runs each timeline of a table as a subtest.
func run(t *testing.T, table []timeline) {
	t.Helper()
	for _, tc := range table {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, tc.cfg)
			w.props = tc.props
			if tc.limitd || tc.down {
				w.withLimitd().limitd.down = tc.down
			}
			for i, st := range tc.steps {
				w.h.Clock.Advance(st.wait)
				for n := range max(st.times, 1) {
					got := w.doUpstream(st.up, st.req...)
					if st.status != 0 && got.status != st.status {
						t.Fatalf("step %d (%d): %v: status %d, want %d (%v %s)", i, n, st.req, got.status, st.status, got.headers, got.body)
					}
					for k, v := range st.headers {
						if !oneOf(got.headers[k], v) {
							t.Fatalf("step %d (%d): %v: %s = %q, want %q (%v)", i, n, st.req, k, got.headers[k], v, got.headers)
						}
					}
					if st.calls != 0 && got.calls != st.calls || st.noCall && got.calls != 0 {
						t.Fatalf("step %d (%d): %v: %d calls answered, want %d (none: %v)", i, n, st.req, got.calls, st.calls, st.noCall)
					}
					if !strings.Contains(got.body, st.body) {
						t.Fatalf("step %d (%d): body %q, want it to contain %q", i, n, got.body, st.body)
					}
				}
			}
			for name, want := range tc.metrics {
				if got := w.count(name); got != want {
					t.Errorf("%s = %d, want %d", name, got, want)
				}
			}
		})
	}
}

// limitRule is a token_bucket rule named name, with extra fields.
func limitRule(name, extra string, rate, burst string) string {
	return `{"name": "` + name + `", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": ` + rate + `, "burst": ` + burst + `}` + extra + `}`
}

// rules is a configuration of the rules, with top-level fields top (each
// followed by a comma).
func rules(top string, rs ...string) string {
	return `{` + top + `"rules": [` + strings.Join(rs, ",") + `]}`
}

func count(sts []int, status int) int {
	n := 0
	for _, s := range sts {
		if s == status {
			n++
		}
	}
	return n
}

// oneOf reports whether got is want or, when want is alternatives a|b|...,
// one of them.
func oneOf(got, want string) bool {
	for _, w := range strings.Split(want, "|") {
		if got == w {
			return true
		}
	}
	return false
}

// The reasons a local reply's body gives, as a client reads them.
const (
	reasonExceeded    = "token_bucket_exceeded"
	reasonConcurrency = "concurrency_limit_exceeded"
	reasonServiceDown = "limit_service_unavailable"
)

// reused is the Stream an adapter hands a Request it reuses (the plugin's
// and the native module's do): one value that acts on whichever request
// the adapter serves now; set Stream to move it to the next.
type reused struct{ *fakehost.Stream }
