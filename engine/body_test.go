package engine_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// inFlight is a response whose body is being sent: begin starts one
// (request and response headers), feed passes chunks, done ends the
// request (after the body's end, or cutting it short).
type inFlight struct {
	w *world
	s *stream
	r *engine.Request
}

func (w *world) begin(respHeaders [][2]string, reqHeaders ...string) inFlight {
	w.t.Helper()
	s, r := w.open(reqHeaders...)
	if s.Replied != 0 {
		w.t.Fatalf("rejected: %d", s.Replied)
	}
	s.Resp = map[string]string{":status": "200"}
	for _, h := range respHeaders {
		s.Resp[h[0]] = h[1]
	}
	r.OnResponseHeaders(false)
	return inFlight{w, s, r}
}

func (f inFlight) feed(chunk string, end bool) {
	f.s.Body = []byte(chunk) // the host keeps only the current chunk
	if a := f.r.OnResponseBody(len(chunk), end); a != engine.Continue {
		f.w.t.Fatalf("body chunk: action %v, want continue", a)
	}
}

func (f inFlight) done() { f.w.end(f.s, f.r) }

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestBodyMemoryNotHeld: bodies in flight at once, each far larger than
// the heap may grow, are not held, whether JSON bodies (32 of 2 MiB under
// max_body_bytes 16 MiB) or events of an event stream (16 of 4 MiB, one
// data line each); their costs are still charged when they end.
func TestBodyMemoryNotHeld(t *testing.T) {
	for _, tc := range []struct {
		name        string
		types       [][2]string
		n, chunks   int
		open, close string
		remaining   string // after a further request reserving 1
	}{
		// 100 − 32 × 2, and the further request's reservation.
		{"JSON bodies", jsonType, 32, 8, `{"pad":"`, `"usage":{"total_tokens":2}}`, "35"},
		{"event streams", sseType, 16, 16, `data: {"pad":"`, "\"usage\":{\"total_tokens\":3}}\n\ndata: [DONE]\n\n", "51"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, budget("response_json:usage.total_tokens", `"default_cost": 1, "max_body_bytes": 16777216`))
			const chunk = 256 << 10
			pad := strings.Repeat("x", chunk)
			before := heapInUse()
			fs := make([]inFlight, tc.n)
			for i := range fs {
				fs[i] = w.begin(tc.types, key...)
				fs[i].feed(tc.open, false)
			}
			for range tc.chunks {
				for i := range fs {
					fs[i].feed(pad, false)
				}
			}
			for i := range fs {
				fs[i].feed(`",`, false)
			}
			grown := int64(heapInUse()) - int64(before)
			if grown > 2<<20 {
				t.Errorf("the heap grew by %d bytes with %d bodies of %d bytes in flight: bodies are held", grown, tc.n, chunk*tc.chunks)
			}
			for i := range fs {
				fs[i].feed(tc.close, true)
				fs[i].done()
			}
			if got := w.count("rule.tokens.cost_missing"); got != 0 {
				t.Errorf("cost_missing = %d, want 0", got)
			}
			if r := w.doUpstream(upstream{headers: [][2]string{{"x-usage", "0"}}}, key...); r.headers["ratelimit-remaining"] != tc.remaining {
				t.Errorf("remaining %q, want %s", r.headers["ratelimit-remaining"], tc.remaining)
			}
		})
	}
}

// TestAskIdentityEncoding: a request under a response_json rule asks the
// upstream for an identity body, whatever the client accepts; other
// requests keep their accept-encoding.
func TestAskIdentityEncoding(t *testing.T) {
	json, header := budget("response_json:usage.total_tokens", ""), budget("response_header:x-usage", "")
	for _, tc := range []struct {
		name, cfg string
		req       []string
		want      string
	}{
		{"response_json", json, []string{"x-api-key", "k", "accept-encoding", "gzip, br"}, "identity"},
		{"response_json, no accept-encoding (any)", json, []string{"x-api-key", "k"}, "identity"},
		{"response_json, the rule does not apply", json, []string{"accept-encoding", "gzip"}, "gzip"},
		{"response_header", header, []string{"x-api-key", "k", "accept-encoding", "gzip"}, "gzip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, tc.cfg)
			s, r := w.open(tc.req...)
			defer w.end(s, r)
			if got := s.Req["accept-encoding"]; got != tc.want {
				t.Errorf("accept-encoding %q, want %q", got, tc.want)
			}
		})
	}
}

// TestTruncatedCost: a body that cannot be read to its end is charged
// truncated_cost (by default the burst), counted in cost_truncated, never
// in cost_missing: one the upstream encoded anyway (never read), one that
// ends before its end of stream (client gone, reset). A stream cut after
// its end event ([DONE]) is charged the usage before it; one cut between
// its usage and its end event is charged truncated_cost (the usage is not
// yet known to be final). Trailers end a body.
func TestTruncatedCost(t *testing.T) {
	json := budget("response_json:n", `"default_cost": 10, "truncated_cost": 60`)
	usage := budget("response_json:usage.total_tokens", `"default_cost": 10, "truncated_cost": 60`)
	encoded := func(enc string) [][2]string { return append([][2]string{{"content-encoding", enc}}, jsonType...) }
	// next: a second request reserving 10.
	next := func(r string) exchange {
		return remaining(upstream{chunks: []string{`{"n":0,"usage":{"total_tokens":0}}`}}, r)
	}
	truncated := func(n int64) map[string]int64 {
		return map[string]int64{"rule.tokens.cost_truncated": n, "rule.tokens.cost_missing": 0}
	}
	run(t, []timeline{
		{name: "gzip", cfg: json, steps: []exchange{{req: key, up: upstream{headers: encoded("gzip"), chunks: []string{`{"n":5}`}}}, next("30")}, metrics: truncated(1)},
		{name: "br, truncated_cost by default the burst", cfg: budget("response_json:n", `"default_cost": 10`),
			steps: []exchange{{req: key, up: upstream{headers: encoded("br"), chunks: []string{`{"n":5}`}}}, {req: key, status: 429}}, metrics: truncated(1)},
		{name: "Identity", cfg: json, steps: []exchange{{req: key, up: upstream{headers: encoded("Identity"), chunks: []string{`{"n":5}`}}}, next("85")}, metrics: truncated(0)},
		{name: "cut: stream before its usage", cfg: usage, steps: []exchange{
			{req: key, up: upstream{headers: sseType, cut: true, chunks: []string{"data: {\"choices\":[{\"delta\":\"hi\"}]}\n\n", "data: {\"choices\":[]}\n\n"}}},
			next("30")}, metrics: truncated(1)},
		{name: "cut: stream after its end event", cfg: usage, steps: []exchange{
			{req: key, up: upstream{headers: sseType, cut: true, chunks: []string{"data: {\"usage\":{\"total_tokens\":7}}\n\n", "data: [DONE]\n\n"}}},
			next("83")}, metrics: truncated(0)},
		{name: "cut: stream after its usage, before its end event", cfg: usage, steps: []exchange{
			{req: key, up: upstream{headers: sseType, cut: true, chunks: []string{"data: {\"usage\":{\"total_tokens\":7}}\n\n"}}},
			next("30")}, metrics: truncated(1)},
		{name: "cut: stream within its usage event", cfg: usage, steps: []exchange{
			{req: key, up: upstream{headers: sseType, cut: true, chunks: []string{"data: {\"usage\":{\"total_tokens\":7}}\n"}}},
			next("30")}, metrics: truncated(1)},
		{name: "cut: JSON body", cfg: usage, steps: []exchange{
			{req: key, up: upstream{headers: jsonType, cut: true, chunks: []string{`{"usage":{"total_tokens":7}}`}}},
			next("30")}, metrics: truncated(1)},
		{name: "cut: nothing of the body", cfg: usage, steps: []exchange{
			{req: key, up: upstream{headers: jsonType, cut: true}},
			next("30")}, metrics: truncated(1)},
		{name: "trailers end the body", cfg: json, steps: []exchange{
			{req: key, up: upstream{headers: jsonType, trailers: true, chunks: []string{`{"n":3}`}}},
			remaining(upstream{}, "87")}, metrics: map[string]int64{"rule.tokens.cost_truncated": 0}},
	})
}

// TestBodyBudget: past the plugin's budget for in-flight scans, a cost is
// missing (counted, and logged once a second however many go past), and
// the budget comes back as scans end.
func TestBodyBudget(t *testing.T) {
	h := fakehost.New()
	p, err := engine.New(h, []byte(budget("response_json:n", `"default_cost": 10`)), "", engine.Options{BodyBudget: 2 * engine.ScanBytes})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, h: h, p: p}
	a, b, c := w.begin(jsonType, key...), w.begin(jsonType, key...), w.begin(jsonType, key...) // c: past the budget
	for _, f := range []inFlight{a, b, c} {
		f.feed(`{"n":1}`, true)
		f.done()
	}
	if got := w.count("rule.tokens.cost_missing"); got != 1 {
		t.Errorf("cost_missing = %d, want 1", got)
	}
	var over []inFlight
	for range 10 { // k2's bucket admits 10 reservations of 10
		over = append(over, w.begin(jsonType, "x-api-key", "k2"))
	}
	for _, f := range over {
		f.done()
	}
	if h.Warns != 1 {
		t.Errorf("%d warnings for the responses past the budget, want 1: %v", h.Warns, h.Logs)
	}
	d := w.begin(jsonType, key...) // the budget is back
	d.feed(`{"n":1}`, true)
	d.done()
	// 100 − 1 − 1 − 10 − 1 (k2 is another bucket), and this reservation.
	if r := w.doUpstream(upstream{}, key...); r.headers["ratelimit-remaining"] != "77" {
		t.Errorf("remaining %q, want 77", r.headers["ratelimit-remaining"])
	}
}
