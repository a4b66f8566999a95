package engine

import (
	"strconv"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/engine/jsonpath"
)

// The request body, for request_json sources (a limit key, a match
// condition, a price table's model or reserve): when the configuration
// reads one (Configuration.ReadsRequestBody) and a body follows the
// headers, the host calls OnRequestHeadersWithBody instead of
// OnRequestHeaders; the engine holds the request (Pause: the host buffers
// the body) and decides it when the body ends (OnRequestBody's end of
// stream, or OnRequestTrailers), with the values the body held. Each piece
// of the body is scanned as it passes, for every request_json path at once
// (package jsonpath: a fixed state per path, nothing of the body kept but
// a value's text, at most jsonpath.MaxValue bytes). A body over
// config.MaxRequestBodyBytes, a body that is not JSON, or one the VM's
// budget of in-flight scans cannot afford, is decided at once, as if it
// held none of the values; a request without a body is decided at its
// headers. A configuration with no request_json source reads no request
// body: its requests cost nothing more.

// requestBody is the scan of one request's body.
type requestBody struct {
	waiting bool // the decision waits for the body's end
	size    int  // body bytes seen
	held    int  // bytes of the VM's budget this scan holds
	over    bool // past the bound, unreadable or not scanned: every value is missing
	scans   []requestScan
	// headers are the request's headers as they were when the decision
	// began to wait (nil: it did not wait).
	headers [][2]string
}

// heldHeaders is a Stream whose request headers are those kept at the
// headers callback (requestBody.headers).
type heldHeaders struct {
	Stream
	headers [][2]string
}

// RequestHeader is the first value of the kept header name.
func (h heldHeaders) RequestHeader(name string) (string, bool) {
	for _, kv := range h.headers {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

// RequestHeaders are the kept headers.
func (h heldHeaders) RequestHeaders() [][2]string { return h.headers }

// requestScan is one request_json path's scanner and what it found.
type requestScan struct {
	scan  jsonpath.Scanner
	found bool
	value string
}

// requestScanBytes is what one path's scan holds, for the VM's budget.
const requestScanBytes = ScanBytes

// awaitBody holds the request until its body has arrived
// (OnRequestHeadersWithBody), unless the VM's budget of scans is spent.
func (c *Request) awaitBody() Action {
	p := c.plugin
	b := &c.reqBody
	n := len(p.bodyPaths)
	if p.bodyHeld+n*requestScanBytes > p.bodyBudget {
		p.warn(&p.headerLog, "request body scans past the VM's budget of "+strconv.Itoa(p.bodyBudget)+" bytes: request_json values missing")
		b.over = true
		return c.OnRequestHeaders()
	}
	b.held = n * requestScanBytes
	p.bodyHeld += b.held
	if cap(b.scans) < n {
		b.scans = make([]requestScan, n)
	}
	b.scans = b.scans[:n]
	for i := range b.scans {
		b.scans[i] = requestScan{}
		b.scans[i].scan.Reset(p.bodyPaths[i])
	}
	b.waiting = true
	// The headers' values are read at the decision, after the body: a
	// host may no longer offer the headers then (proxy-wasm forgets them
	// once they went on), so they are kept now.
	b.headers = c.stream.RequestHeaders()
	if p.readsBody {
		// Asked now, while the headers are the host's to change (a host
		// may let them go on before the body: WaitsForBody).
		c.askIdentityEncoding()
	}
	return Pause
}

// WaitsForBody reports whether the request's decision waits for its body
// (OnRequestHeadersWithBody paused it for that, and it has not ended). A
// host that cannot hold the headers while it hands the engine the body
// (proxy-wasm: a paused header stops the body too) lets the headers go on
// and holds the body instead (OnRequestBody's Pause): the upstream then
// sees the headers of a request the engine may refuse, and never its body
// (the refusal's local reply resets the upstream request).
func (c *Request) WaitsForBody() bool { return c.reqBody.waiting }

// OnRequestBody takes a chunk of size bytes of the request body (the
// bytes the host received since the last call). While the decision waits
// for the body it reads the chunk in pieces and holds the request (Pause);
// at the end of the body, or past the bound, it decides. While the
// decision waits for a call, or the request is held for its tokens, the
// body is held too.
func (c *Request) OnRequestBody(size int, endOfStream bool) Action {
	b := &c.reqBody
	if !b.waiting {
		if c.paused || c.holding || c.leaseHolding {
			return Pause
		}
		return Continue
	}
	if b.size+size > config.MaxRequestBodyBytes {
		b.over = true // decided now, as if the body held no value
		return c.decideWithBody()
	}
	for off := 0; off < size && !b.over; {
		n := min(size-off, bodyPiece)
		piece, err := c.stream.RequestBody(off, n)
		if err != nil {
			p := c.plugin
			p.warn(&p.headerLog, "reading the request body: "+err.Error())
			b.over = true
			break
		}
		b.size += len(piece)
		failed := true
		for i := range b.scans {
			s := &b.scans[i].scan
			s.Write(piece)
			failed = failed && s.Failed()
		}
		b.over = b.over || failed // not JSON: nothing more to learn
		off += n
	}
	if endOfStream || b.over {
		return c.decideWithBody()
	}
	return Pause
}

// OnRequestTrailers: trailers end the request body.
func (c *Request) OnRequestTrailers() Action {
	if c.reqBody.waiting {
		return c.decideWithBody()
	}
	if c.paused || c.holding || c.leaseHolding {
		return Pause
	}
	return Continue
}

// decideWithBody ends the body's scan and decides the request with what
// it found.
func (c *Request) decideWithBody() Action {
	b := &c.reqBody
	b.waiting = false
	c.plugin.bodyHeld -= b.held
	b.held = 0
	for i := range b.scans {
		r := &b.scans[i]
		if b.over {
			continue
		}
		switch v := r.scan.End(); v.Kind {
		case jsonpath.String, jsonpath.Number:
			r.found, r.value = true, string(v.Text)
		}
	}
	return c.OnRequestHeaders()
}

// bodyValue is the value the request body gave a request_json source.
func (c *Request) bodyValue(src config.Source) (string, bool) {
	b := &c.reqBody
	p := c.plugin
	for i, path := range p.bodyPaths {
		if i < len(b.scans) && path.String() == src.Name {
			return b.scans[i].value, b.scans[i].found && !b.over
		}
	}
	return "", false
}

// requestJSONPaths are the distinct request_json paths of a configuration,
// compiled: its rules' limit keys, match conditions and price tables.
func requestJSONPaths(cfg *config.Config) []*jsonpath.Path {
	var names []string
	add := func(s config.Source) {
		if s.Kind != config.SourceRequestJSON {
			return
		}
		for _, n := range names {
			if n == s.Name {
				return
			}
		}
		names = append(names, s.Name)
	}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		for _, k := range r.LimitKeys {
			add(k)
		}
		for _, m := range r.Match {
			add(m.Source)
		}
		if m := r.Cost.Money; m != nil {
			add(m.Model)
			if m.Reserve.Set {
				add(m.Reserve.Source)
			}
		}
	}
	paths := make([]*jsonpath.Path, len(names))
	for i, n := range names {
		paths[i] = jsonpath.NewPath(n)
	}
	return paths
}

// ReadsRequestBody reports whether a Request may read a request body
// under c: only a request_json source does. Without one, a host calls
// OnRequestHeaders for every request, and hands the engine no request
// body callback.
func (c *Configuration) ReadsRequestBody() bool { return len(requestJSONPaths(c.cfg)) > 0 }
