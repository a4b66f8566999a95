package hostcontract

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// Driver runs the clauses' host side on one engine.Host: an adapter built
// with the tag hostcontract runs it where it runs the engine (one per
// plugin context or worker, as the engine), so every host call a clause
// makes goes through the adapter under test. Like the engine, it is called
// from one thread at a time.
type Driver struct{ h engine.Host }

// New returns the Driver of host h.
func New(h engine.Host) *Driver { return &Driver{h: h} }

// NewRequest returns the handler of the requests the host offers through
// s, one after another (adapters reuse it, as they reuse the engine's).
func (d *Driver) NewRequest(s engine.Stream) *Request { return &Request{d: d, s: s} }

// Request hands one stream's callbacks to the clause its path names
// (/contract/<clause>); other paths pass untouched.
type Request struct {
	d *Driver
	s engine.Stream
	x *exec // the request in progress, nil between requests
}

// OnRequestHeaders starts the clause's host side.
func (r *Request) OnRequestHeaders() engine.Action {
	x := &exec{h: r.d.h, s: r.s}
	r.x = x
	path, _ := r.s.RequestHeader(":path")
	name, ok := strings.CutPrefix(path, PathPrefix)
	if !ok {
		return engine.Continue
	}
	x.run, _ = r.s.RequestHeader(HeaderRun)
	x.op, _ = r.s.RequestHeader(HeaderOp)
	c := byName(name)
	if c == nil {
		return x.sync(errorf("no clause %q", name))
	}
	return c.host(x)
}

// OnRequestHeadersWithBody implements the adapters' handler: the clauses
// run at the headers, whether a body follows or not, except the request
// body's, which waits for the body as the engine does (Pause, then
// OnRequestBody).
func (r *Request) OnRequestHeadersWithBody() engine.Action {
	path, _ := r.s.RequestHeader(":path")
	if path != PathPrefix+requestBodyClause {
		return r.OnRequestHeaders()
	}
	x := &exec{h: r.d.h, s: r.s}
	r.x = x
	x.run, _ = r.s.RequestHeader(HeaderRun)
	n, _ := r.s.RequestHeader(HeaderBodyBytes)
	x.want, _ = strconv.Atoi(n)
	if x.want <= 0 {
		return x.sync(errorf("no %s", HeaderBodyBytes))
	}
	x.waiting = true
	return engine.Pause
}

// WaitsForBody reports whether the request waits for its body, as the
// engine's Request.WaitsForBody.
func (r *Request) WaitsForBody() bool { return r.x != nil && r.x.waiting }

// OnRequestBody reads the chunk in pieces of at most 1000 bytes, as the
// engine reads in pieces, and judges the body at its end.
func (r *Request) OnRequestBody(size int, endOfStream bool) engine.Action {
	x := r.x
	if x == nil || !x.waiting {
		return engine.Continue
	}
	for off := 0; off < size; {
		n := min(size-off, 1000)
		b, err := r.s.RequestBody(off, n)
		if err != nil || len(b) != n {
			x.waiting = false
			return x.sync(errorf("RequestBody(%d, %d) of a chunk of %d bytes after %d = %d bytes, %v", off, n, size, len(x.got), len(b), err))
		}
		x.got = append(x.got, b...)
		off += n
	}
	if endOfStream {
		return r.endBody()
	}
	return engine.Pause
}

// OnRequestTrailers implements the adapters' handler: trailers end the
// body.
func (r *Request) OnRequestTrailers() engine.Action {
	if r.x != nil && r.x.waiting {
		return r.endBody()
	}
	return engine.Continue
}

// endBody judges the body that arrived.
func (r *Request) endBody() engine.Action {
	x := r.x
	x.waiting = false
	if want := Body(x.want); !bytes.Equal(x.got, want) {
		i := 0
		for i < len(x.got) && i < len(want) && x.got[i] == want[i] {
			i++
		}
		return x.sync(errorf("the body handed over is %d bytes, want %d; they differ from byte %d", len(x.got), len(want), i))
	}
	return x.sync(nil)
}

// OnResponseHeaders runs what the clause does with the response.
func (r *Request) OnResponseHeaders(bool) engine.Action {
	if x := r.x; x != nil && x.onResponse != nil {
		x.onResponse()
	}
	return engine.Continue
}

// OnResponseBody implements the adapters' handler: clauses read no body.
func (r *Request) OnResponseBody(int, bool) engine.Action { return engine.Continue }

// OnResponseTrailers implements the adapters' handler.
func (r *Request) OnResponseTrailers() engine.Action { return engine.Continue }

// Done ends the request: what its calls bring later is not reported.
func (r *Request) Done() {
	if r.x != nil {
		r.x.done = true
		r.x = nil
	}
}

// exec is one request running a clause's host side.
type exec struct {
	h   engine.Host
	s   engine.Stream
	run string // HeaderRun: keys of one run of the suite are its own
	op  string // HeaderOp
	// done: the request ended (Request.Done).
	done bool
	// onResponse, if set, runs at the response's headers.
	onResponse func()
	// The request body's clause: waiting for want bytes, got so far.
	waiting bool
	want    int
	got     []byte
}

// key is a shared-data key of this run.
func (x *exec) key(name string) string { return "hostcontract:" + x.run + ":" + name }

// verdict answers the request with the clause's verdict: 200 with
// HeaderVerdict "pass", or "fail" and the reason as the body.
func (x *exec) verdict(err error) {
	if x.done {
		return
	}
	v, body := "pass", ""
	if err != nil {
		v, body = "fail", err.Error()
	}
	_ = x.s.SendReply(200, [][2]string{{HeaderVerdict, v}}, []byte(body)) // a reply the host refuses shows as no verdict
}

// sync gives a verdict from the request's first callback.
func (x *exec) sync(err error) engine.Action {
	x.verdict(err)
	return engine.Pause
}

// call is a call to the contract's upstream (UpstreamCluster) at path.
func (x *exec) call(cluster, path, body string, timeoutMS uint32, maxBody int) *engine.Call {
	return &engine.Call{
		Cluster: cluster,
		Headers: [][2]string{
			{":method", "POST"}, {":path", path}, {":authority", "hostcontract"},
			{HeaderRun, x.run}, {HeaderProbe, "probe-" + x.run},
		},
		Body: []byte(body), TimeoutMS: timeoutMS, MaxBody: maxBody,
	}
}

// send sends c as the request's call (Stream.Callout) or, with viaHost, as
// the plugin's (Host.Callout), whose answer reaches the request through
// Stream.Run. answer runs acting on the request, unless the request is
// done (adapters reuse a Stream for a later request, so the Driver, as the
// engine, looks after that itself).
func (x *exec) send(viaHost bool, c *engine.Call, answer func(*engine.Answer)) error {
	live := func(a *engine.Answer) {
		if !x.done {
			answer(a)
		}
	}
	if !viaHost {
		return x.s.Callout(c, live)
	}
	return x.h.Callout(c, func(a *engine.Answer) {
		_ = x.s.Run(func() { live(a) }) // refused once the request is gone
	})
}

// fence sends a call to the upstream's /fence the same way and runs then
// when it is answered (or at once when the host refuses it): by then an
// answer delivered twice would have been delivered again.
func (x *exec) fence(viaHost bool, then func()) {
	if err := x.send(viaHost, x.call(UpstreamCluster, "/fence", "", calloutTimeoutMS, 1024), func(*engine.Answer) { then() }); err != nil {
		then()
	}
}
