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

// TestContractCatchesBrokenHosts: a fake host broken in one way fails the
// clauses that say what it breaks, by name, and passes the others.
func TestContractCatchesBrokenHosts(t *testing.T) {
	cases := []struct {
		name    string
		breakIt func(f *fakeTarget)
		want    []string // the clauses that fail
		// may fail: no-lost-updates loses an update only when two
		// workers' reads and writes interleave.
		may []string
	}{
		{"shared data ignores the cas", func(f *fakeTarget) {
			f.wrapSD(func(sd engine.SharedData) engine.SharedData { return ignoresCAS{sd} })
		}, []string{"shared-data/stale-cas-refused", "shared-data/cas-unique-across-keys", "shared-data/concurrent-writers-one-wins"},
			[]string{"shared-data/no-lost-updates-across-workers"}},
		{"every answer delivered twice", func(f *fakeTarget) { f.answers = 2 }, []string{
			"callout/timeout-fails-once", "callout/plugin-timeout-fails-once",
			"callout/missing-cluster-fails-once", "callout/plugin-missing-cluster-fails-once",
			"callout/answer-arrives-once", "callout/plugin-answer-arrives-once", "callout/body-over-max-is-too-large",
			"resume/after-callout-answer", "resume/after-plugin-callout-answer", "timer/resume-after-delay-once"}, nil},
		{"timers run at once", func(f *fakeTarget) { f.earlyTimers = true }, []string{"timer/resume-after-delay-once"}, nil},
		{"request body read from the chunk's start", func(f *fakeTarget) { f.bodyFromStart = true },
			[]string{"request-body/whole-before-the-decision"}, nil},
		{"request body not handed over", func(f *fakeTarget) { f.noBody = true },
			[]string{"request-body/whole-before-the-decision"}, nil},
		{"the clock goes back", func(f *fakeTarget) {
			f.wrapHost(func(h engine.Host) engine.Host { return &backwards{Host: h} })
		}, []string{"clock/monotone", "clock/advances-across-a-callout", "timer/resume-after-delay-once"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeTarget(2)
			c.breakIt(f)
			want, may := map[string]bool{}, map[string]bool{}
			for _, n := range c.want {
				want[n] = true
			}
			for _, n := range c.may {
				may[n] = true
			}
			for i := range hostcontract.Clauses {
				cl := &hostcontract.Clauses[i]
				err := cl.Check(f, "broken-"+strconv.Itoa(i))
				switch {
				case want[cl.Name] && err == nil:
					t.Errorf("contract/%s passed on a host where %s", cl.Name, c.name)
				case !want[cl.Name] && !may[cl.Name] && err != nil:
					t.Errorf("contract/%s failed on a host where %s: %v", cl.Name, c.name, err)
				}
			}
		})
	}
}

// ignoresCAS is shared data that writes whatever the cas.
type ignoresCAS struct{ engine.SharedData }

func (s ignoresCAS) Set(key string, value []byte, _ uint32) error {
	return s.SharedData.Set(key, value, 0)
}

// backwards is a host whose clock goes back 1 ms at every reading.
type backwards struct {
	engine.Host
	n int64
}

func (b *backwards) Now() int64 { b.n++; return b.Host.Now() - b.n*1_000_000 }

// fakeTarget is Envoy played in process: workers, each a fakehost.Host
// running a Driver under its own lock, the calls' cluster, the upstream.
type fakeTarget struct {
	clock   *fakehost.Clock
	workers []*fakeWorker
	next    atomic.Uint32
	up      http.Handler
	// answers is how many times each call is answered (and each timer
	// run): 1 (0 is 1), or more for a broken host; earlyTimers runs a
	// timer at once, whatever its delay (a broken host).
	answers     int
	earlyTimers bool
	// bodyFromStart: RequestBody ignores its offset (a broken host);
	// noBody: the host says no body follows the headers.
	bodyFromStart, noBody bool
}

// fromStart is a Stream whose RequestBody reads from the chunk's start,
// whatever the offset.
type fromStart struct{ *fakehost.Stream }

func (s fromStart) RequestBody(_, size int) ([]byte, error) { return s.Stream.RequestBody(0, size) }

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

// wrapHost gives every worker's Driver w(its host) instead.
func (f *fakeTarget) wrapHost(w func(engine.Host) engine.Host) {
	for _, wk := range f.workers {
		wk.d = hostcontract.New(w(wk.h))
	}
}

// wrapSD gives every worker w(its shared data) instead.
func (f *fakeTarget) wrapSD(w func(engine.SharedData) engine.SharedData) {
	for _, wk := range f.workers {
		wk.h.SD = w(wk.h.SD)
	}
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
	s.Clock = f.clock
	for k, v := range header {
		s.Req[k] = v
	}
	var st engine.Stream = s
	if f.bodyFromStart {
		st = fromStart{s}
	}
	r := w.d.NewRequest(st)
	defer r.Done()
	var goesOn bool
	if n, err := strconv.Atoi(header[hostcontract.HeaderBodyBytes]); err == nil && !f.noBody {
		// A body follows: in chunks of up to 64 KiB, as Envoy hands them.
		body := hostcontract.Body(n)
		goesOn = r.OnRequestHeadersWithBody() == engine.Continue
		for off := 0; off < len(body) && s.Replied == 0; {
			end := min(off+64<<10, len(body))
			s.ReqBody = body[off:end]
			goesOn = r.OnRequestBody(end-off, end == len(body)) == engine.Continue
			off = end
		}
	} else {
		goesOn = r.OnRequestHeaders() == engine.Continue
	}
	const maxRounds = 64
	for range maxRounds {
		calls := append(w.h.TakeCalls(), s.TakeCalls()...)
		due := f.nextTimer(s)
		if len(calls) == 0 && len(s.Deferred) == 0 && due == 0 {
			break
		}
		if due != 0 && len(calls) == 0 && len(s.Deferred) == 0 {
			// Nothing else to do: time passes until the timer is due.
			if f.earlyTimers {
				due = f.clock.Now()
			}
			f.clock.Set(max(f.clock.Now(), due))
			for range max(f.answers, 1) {
				for _, tm := range s.Timers {
					if tm.Due <= f.clock.Now() || f.earlyTimers {
						tm.Fired = false
					}
				}
				s.Fire(max(f.clock.Now(), due))
			}
			continue
		}
		for _, c := range calls {
			a := f.answer(c.Call)
			for range max(f.answers, 1) {
				c.Answer(a)
			}
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

// nextTimer is the moment of s's earliest timer not yet run, 0 when none.
func (f *fakeTarget) nextTimer(s *fakehost.Stream) int64 {
	due := int64(0)
	for _, tm := range s.Timers {
		if !tm.Fired && (due == 0 || tm.Due < due) {
			due = tm.Due
		}
	}
	return due
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
