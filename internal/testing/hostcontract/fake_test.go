package hostcontract_test

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/hostcontract"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

// TestContractFakeHost runs the host contract on the engine's fake host:
// two workers over one shared data and one clock, the test playing Envoy
// (it answers the held calls with hostcontract.Upstream, in process, and
// moves the clock by each call's latency).
func TestContractFakeHost(t *testing.T) {
	hostcontract.Run(t, newFakeTarget(2))
}

// fakeTarget is Envoy played in process: workers, each a fakehost.Host
// running a Driver under its own lock, the calls' cluster, the upstream.
type fakeTarget struct {
	clock   *fakehost.Clock
	workers []*fakeWorker
	next    atomic.Uint32
	up      http.Handler
}

type fakeWorker struct {
	mu sync.Mutex
	h  *fakehost.Host
	d  *hostcontract.Driver
}

// latency is what a call or a request to the upstream takes on the fake
// clock.
const latency = 1_000_000

func newFakeTarget(workers int) *fakeTarget {
	clock, sd := fakehost.NewClock(1_000e9), shareddata.New()
	f := &fakeTarget{clock: clock, up: hostcontract.NewUpstream()}
	for range workers {
		h := fakehost.New()
		h.Clock, h.SD = clock, sd
		f.workers = append(f.workers, &fakeWorker{h: h, d: hostcontract.New(h)})
	}
	return f
}

var errPaused = errors.New("fakehost: the request was left paused")

// Do runs one request on the next worker: its headers, then every call
// answered and every deferred run run (at most maxRounds rounds), then the
// upstream if the request went on, and its response headers.
func (f *fakeTarget) Do(path string, header map[string]string) (hostcontract.Outcome, error) {
	w := f.workers[f.next.Add(1)%uint32(len(f.workers))]
	w.mu.Lock()
	defer w.mu.Unlock()
	o := hostcontract.Outcome{Sent: f.clock.Now()}
	s := fakehost.NewStream(":path", path)
	s.DeferRun = true
	for k, v := range header {
		s.Req[k] = v
	}
	r := w.d.NewRequest(s)
	defer r.Done()
	goesOn := r.OnRequestHeaders() == engine.Continue
	const maxRounds = 64
	for range maxRounds {
		calls := append(w.h.TakeCalls(), s.TakeCalls()...)
		if len(calls) == 0 && len(s.Deferred) == 0 {
			break
		}
		for _, c := range calls {
			c.Answer(f.answer(c.Call))
		}
		s.RunDeferred()
	}
	switch {
	case s.Replied != 0:
		o.Status, o.Header, o.Body = s.Replied, http.Header{}, string(s.ReplyBody)
		for _, h := range s.ReplyHeaders {
			o.Header.Add(h[0], h[1])
		}
	case goesOn || s.Resumed > 0:
		var rec *httptest.ResponseRecorder
		for range max(s.Resumed, 1) { // each resume forwards the request
			req := httptest.NewRequest(s.Req[":method"], s.Req[":path"], nil)
			for k, v := range s.Req {
				if k[0] != ':' {
					req.Header.Set(k, v)
				}
			}
			rec = httptest.NewRecorder()
			f.up.ServeHTTP(rec, req)
			f.clock.Advance(latency)
		}
		s.Resp[":status"] = strconv.Itoa(rec.Code)
		for k := range rec.Header() { // the engine reads lower-case names
			s.Resp[strings.ToLower(k)] = rec.Header().Get(k)
		}
		r.OnResponseHeaders(false)
		o.Status, o.Header, o.Body = rec.Code, rec.Header().Clone(), rec.Body.String()
		for _, h := range s.Added {
			o.Header.Add(h[0], h[1])
		}
	default:
		return o, errPaused
	}
	s.Done = true
	o.Received = f.clock.Now()
	return o, nil
}

// answer is what Envoy answers to c: the upstream's answer (a cluster
// other than hostcontract.UpstreamCluster fails; /silent times out, which
// Envoy answers 504), after the call's latency or its timeout.
func (f *fakeTarget) answer(c *engine.Call) *engine.Answer {
	if c.Cluster != hostcontract.UpstreamCluster {
		f.clock.Advance(latency)
		return &engine.Answer{Failed: true}
	}
	hs := http.Header{}
	var method, path string
	for _, h := range c.Headers {
		switch h[0] {
		case ":method":
			method = h[1]
		case ":path":
			path = h[1]
		default:
			hs.Add(h[0], h[1])
		}
	}
	if path == "/silent" { // as Envoy answers a call that timed out
		f.clock.Advance(int64(c.TimeoutMS) * 1e6)
		return &engine.Answer{Status: "504", Body: []byte("upstream request timeout")}
	}
	req := httptest.NewRequest(method, path, bytes.NewReader(c.Body))
	req.Header = hs
	rec := httptest.NewRecorder()
	f.up.ServeHTTP(rec, req)
	f.clock.Advance(latency)
	if rec.Body.Len() > c.MaxBody {
		return &engine.Answer{Status: strconv.Itoa(rec.Code), TooLarge: true}
	}
	return &engine.Answer{Status: strconv.Itoa(rec.Code), Body: rec.Body.Bytes()}
}
