package plugin

import (
	"runtime"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// inFlight is a response whose body is being sent: open starts one (request
// and response headers), feed passes chunks, and close ends it.
type inFlight struct {
	e  *emulator
	id uint32
}

func (e *emulator) open(respHeaders [][2]string, reqHeaders ...string) inFlight {
	e.t.Helper()
	id := e.host.InitializeHttpContext()
	e.host.CallOnRequestHeaders(id, requestHeaders(reqHeaders), false)
	if lr := e.host.GetSentLocalResponse(id); lr != nil {
		e.t.Fatalf("rejected: %d", lr.StatusCode)
	}
	e.host.CallOnResponseHeaders(id, append([][2]string{{":status", "200"}}, respHeaders...), false)
	return inFlight{e: e, id: id}
}

func (f inFlight) feed(chunk string, end bool) {
	if a := f.e.host.CallOnResponseBody(f.id, []byte(chunk), end); a != types.ActionContinue {
		f.e.t.Fatalf("body chunk: action %v, want continue", a)
	}
}

// done ends the stream: after the body's end, or cutting it short.
func (f inFlight) done() { f.e.host.CompleteHttpContext(f.id) }

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

var jsonType = [][2]string{{"content-type", "application/json"}}
var sseType = [][2]string{{"content-type", "text/event-stream"}}

// TestBodyMemoryNotPerBody: 32 JSON answers of 2 MiB each in flight at once,
// under max_body_bytes 16 MiB, hold no copy of their bodies; their costs are
// still charged when they end.
func TestBodyMemoryNotPerBody(t *testing.T) {
	e := start(t, budget("response_json:usage.total_tokens", `"default_cost": 1, "max_body_bytes": 16777216`, ""))
	const n, chunk, chunks = 32, 256 << 10, 8
	pad := strings.Repeat("x", chunk)
	before := heapInUse()
	fs := make([]inFlight, n)
	for i := range fs {
		fs[i] = e.open(jsonType, "x-api-key", "k")
		fs[i].feed(`{"pad":"`, false)
	}
	for c := 0; c < chunks; c++ {
		for i := range fs {
			fs[i].feed(pad, false)
		}
	}
	for i := range fs {
		fs[i].feed(`",`, false) // the emulator keeps only this last chunk
	}
	grown := int64(heapInUse()) - int64(before)
	if grown > 2<<20 {
		t.Errorf("the heap grew by %d bytes with %d bodies of %d bytes in flight: bodies are held", grown, n, chunk*chunks)
	}
	for i := range fs {
		fs[i].feed(`"usage":{"total_tokens":2}}`, true)
		fs[i].done()
	}
	// 100 − 32 × 2.
	if r := e.doUpstream(upstream{status: "200", headers: [][2]string{{"x-usage", "0"}}}, "x-api-key", "k"); r.headers["ratelimit-remaining"] != "35" {
		t.Errorf("remaining %q, want 35 (32 costs of 2, and this request's reservation)", r.headers["ratelimit-remaining"])
	}
	if got := e.counter("rule.tokens.cost_missing"); got != 1 { // the last request's body has no usage
		t.Errorf("cost_missing = %d, want 1", got)
	}
}

// TestStreamMemoryNotPerEvent: an event of 4 MiB (one data line) in each of
// 16 streams in flight is not held either.
func TestStreamMemoryNotPerEvent(t *testing.T) {
	e := start(t, budget("response_json:usage.total_tokens", `"max_body_bytes": 16777216`, ""))
	const n, chunk, chunks = 16, 256 << 10, 16
	pad := strings.Repeat("y", chunk)
	before := heapInUse()
	fs := make([]inFlight, n)
	for i := range fs {
		fs[i] = e.open(sseType, "x-api-key", "k")
		fs[i].feed(`data: {"pad":"`, false)
	}
	for c := 0; c < chunks; c++ {
		for i := range fs {
			fs[i].feed(pad, false)
		}
	}
	for i := range fs {
		fs[i].feed(`",`, false)
	}
	grown := int64(heapInUse()) - int64(before)
	if grown > 2<<20 {
		t.Errorf("the heap grew by %d bytes with %d events of %d bytes in flight: events are held", grown, n, chunk*chunks)
	}
	for i := range fs {
		fs[i].feed("\"usage\":{\"total_tokens\":3}}\n\ndata: [DONE]\n\n", true)
		fs[i].done()
	}
	if got := e.counter("rule.tokens.cost_missing"); got != 0 {
		t.Errorf("cost_missing = %d, want 0", got)
	}
}

// TestResponseCostValues: duplicate keys resolve to the last; a positive
// cost below MinCost is not a cost; nesting has no depth limit.
func TestResponseCostValues(t *testing.T) {
	for _, tc := range []struct {
		name      string
		body      string
		remaining string // after a second request that reserves 10
		missing   uint64
	}{
		{"duplicate keys: the last", `{"n":5,"n":30}`, "60", 0},
		{"duplicate objects: the last", `{"u":{"n":5},"u":{"n":30}}`, "60", 0},
		{"tiny positive cost", `{"n":5e-324}`, "80", 1},
		{"below MinCost", `{"n":0.0009}`, "80", 1},
		{"MinCost", `{"n":0.001}`, "89", 0},
		{"zero", `{"n":0}`, "90", 0},
		{"deep nesting elsewhere", `{"x":` + strings.Repeat(`[{"a":`, 5000) + "1" + strings.Repeat(`}]`, 5000) + `,"n":30}`, "60", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := "n"
			if strings.Contains(tc.body, `"u"`) {
				path = "u.n"
			}
			e := start(t, budget("response_json:"+path, `"default_cost": 10`, ""))
			e.doUpstream(upstream{status: "200", chunks: []string{tc.body[:len(tc.body)/2], tc.body[len(tc.body)/2:]}}, "x-api-key", "k")
			r := e.doUpstream(upstream{status: "200"}, "x-api-key", "k")
			if got := r.headers["ratelimit-remaining"]; got != tc.remaining {
				t.Errorf("remaining %q, want %s", got, tc.remaining)
			}
			if got := e.counter("rule.tokens.cost_missing"); got != tc.missing+1 { // +1: the second request had no body
				t.Errorf("cost_missing = %d, want %d", got, tc.missing+1)
			}
		})
	}
	e := start(t, budget("response_header:x-usage", `"default_cost": 10`, ""))
	e.doUpstream(upstream{status: "200", headers: [][2]string{{"x-usage", "1e-300"}}}, "x-api-key", "k")
	if got := e.counter("rule.tokens.cost_missing"); got != 1 {
		t.Errorf("header cost 1e-300: cost_missing = %d, want 1", got)
	}
}

// TestAskIdentityEncoding: a request under a response_json rule asks the
// upstream for an identity body, whatever the client accepts; other
// requests keep their accept-encoding.
func TestAskIdentityEncoding(t *testing.T) {
	acceptEncoding := func(e *emulator, headers ...string) string {
		id := e.host.InitializeHttpContext()
		e.host.CallOnRequestHeaders(id, requestHeaders(headers), false)
		defer e.host.CompleteHttpContext(id)
		for _, h := range e.host.GetCurrentRequestHeaders(id) {
			if h[0] == "accept-encoding" {
				return h[1]
			}
		}
		return ""
	}
	t.Run("response_json", func(t *testing.T) {
		e := start(t, budget("response_json:usage.total_tokens", "", ""))
		if got := acceptEncoding(e, "x-api-key", "k", "accept-encoding", "gzip, br"); got != "identity" {
			t.Errorf("accept-encoding %q, want identity", got)
		}
		if got := acceptEncoding(e, "x-api-key", "k"); got != "identity" {
			t.Errorf("without accept-encoding: %q, want identity (none means any)", got)
		}
		if got := acceptEncoding(e, "accept-encoding", "gzip"); got != "gzip" {
			t.Errorf("a request the rule does not apply to: %q, want gzip", got)
		}
	})
	t.Run("response_header", func(t *testing.T) {
		e := start(t, budget("response_header:x-usage", "", ""))
		if got := acceptEncoding(e, "x-api-key", "k", "accept-encoding", "gzip"); got != "gzip" {
			t.Errorf("response_header rule: %q, want gzip kept", got)
		}
	})
}

// TestEncodedResponseChargedTruncated: a body the upstream encoded anyway
// is charged truncated_cost, counted in cost_truncated, and never read.
func TestEncodedResponseChargedTruncated(t *testing.T) {
	for _, tc := range []struct {
		name, alg, encoding, remaining string
		truncated                      uint64
	}{
		{"gzip", `"default_cost": 10, "truncated_cost": 60`, "gzip", "30", 1},
		{"default is burst", `"default_cost": 10`, "br", "0", 1},
		{"identity", `"default_cost": 10, "truncated_cost": 60`, "Identity", "85", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, budget("response_json:n", tc.alg, ""))
			f := e.open(append([][2]string{{"content-encoding", tc.encoding}}, jsonType...), "x-api-key", "k")
			f.feed(`{"n":5}`, true)
			f.done()
			if got := e.counter("rule.tokens.cost_truncated"); got != tc.truncated {
				t.Errorf("cost_truncated = %d, want %d", got, tc.truncated)
			}
			if got := e.counter("rule.tokens.cost_missing"); got != 0 {
				t.Errorf("cost_missing = %d, want 0", got)
			}
			// The next request reserves 10 and shows it.
			r := e.doUpstream(upstream{status: "200", chunks: []string{`{"n":0}`}}, "x-api-key", "k")
			if tc.remaining == "0" {
				if r.status != 429 {
					t.Errorf("status %d, want 429 (the burst was charged)", r.status)
				}
				return
			}
			if got := r.headers["ratelimit-remaining"]; got != tc.remaining {
				t.Errorf("remaining %q, want %s", got, tc.remaining)
			}
		})
	}
}

// TestCutShortChargedTruncated: a body that ends before its end of stream
// (client gone, reset) is charged truncated_cost and counted apart from
// cost_missing; a stream cut after its end event ([DONE]) is charged the
// usage before it, and one cut between its usage and its end event is
// charged truncated_cost (the usage is not yet known to be final).
func TestCutShortChargedTruncated(t *testing.T) {
	for _, tc := range []struct {
		name      string
		types     [][2]string
		chunks    []string
		remaining string // after a second request reserving 10
		truncated uint64
	}{
		{"stream before its usage", sseType, []string{"data: {\"choices\":[{\"delta\":\"hi\"}]}\n\n", "data: {\"choices\":[]}\n\n"}, "30", 1},
		{"stream after its end event", sseType, []string{"data: {\"usage\":{\"total_tokens\":7}}\n\n", "data: [DONE]\n\n"}, "83", 0},
		{"stream after its usage, before its end event", sseType, []string{"data: {\"usage\":{\"total_tokens\":7}}\n\n"}, "30", 1},
		{"stream within its usage event", sseType, []string{"data: {\"usage\":{\"total_tokens\":7}}\n"}, "30", 1},
		{"JSON body", jsonType, []string{`{"usage":{"total_tokens":7}}`}, "30", 1},
		{"nothing of the body", jsonType, nil, "30", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, budget("response_json:usage.total_tokens", `"default_cost": 10, "truncated_cost": 60`, ""))
			f := e.open(tc.types, "x-api-key", "k")
			for _, c := range tc.chunks {
				f.feed(c, false)
			}
			f.done()
			if got := e.counter("rule.tokens.cost_truncated"); got != tc.truncated {
				t.Errorf("cost_truncated = %d, want %d", got, tc.truncated)
			}
			if got := e.counter("rule.tokens.cost_missing"); got != 0 {
				t.Errorf("cost_missing = %d, want 0", got)
			}
			r := e.doUpstream(upstream{status: "200"}, "x-api-key", "k")
			if got := r.headers["ratelimit-remaining"]; got != tc.remaining {
				t.Errorf("remaining %q, want %s", got, tc.remaining)
			}
		})
	}
}

// TestTrailersEndTheBody: a body followed by trailers has ended: its cost is
// charged, not truncated_cost.
func TestTrailersEndTheBody(t *testing.T) {
	e := start(t, budget("response_json:n", `"default_cost": 10, "truncated_cost": 60`, ""))
	f := e.open(jsonType, "x-api-key", "k")
	f.feed(`{"n":3}`, false)
	e.host.CallOnResponseTrailers(f.id, [][2]string{{"grpc-status", "0"}})
	f.done()
	if got := e.counter("rule.tokens.cost_truncated"); got != 0 {
		t.Errorf("cost_truncated = %d, want 0", got)
	}
	r := e.doUpstream(upstream{status: "200"}, "x-api-key", "k")
	if got := r.headers["ratelimit-remaining"]; got != "87" {
		t.Errorf("remaining %q, want 87", got)
	}
}

// TestBodyBudgetPerVM: past the VM's budget for in-flight scans, a cost is
// missing (counted), and the budget comes back as scans end.
func TestBodyBudgetPerVM(t *testing.T) {
	e := start(t, budget("response_json:n", `"default_cost": 10`, ""), func(_ *proxytest.EmulatorOption, vm *vmContext) {
		vm.bodyBudget = 2 * engine.ScanBytes
	})
	a := e.open(jsonType, "x-api-key", "k")
	b := e.open(jsonType, "x-api-key", "k")
	c := e.open(jsonType, "x-api-key", "k") // past the budget
	for _, f := range []inFlight{a, b, c} {
		f.feed(`{"n":1}`, true)
		f.done()
	}
	if got := e.counter("rule.tokens.cost_missing"); got != 1 {
		t.Errorf("cost_missing = %d, want 1", got)
	}
	// However many go past it, the log gets one line a second.
	over := make([]inFlight, 0, 12)
	over = append(over, e.open(jsonType, "x-api-key", "k2"), e.open(jsonType, "x-api-key", "k2"))
	for i := 0; i < 8; i++ { // k2's bucket admits 10 reservations of 10
		over = append(over, e.open(jsonType, "x-api-key", "k2"))
	}
	for _, f := range over {
		f.done()
	}
	if n := len(e.host.GetWarnLogs()); n != 1 {
		t.Errorf("%d warnings for 9 responses past the budget, want 1: %v", n, e.host.GetWarnLogs())
	}
	d := e.open(jsonType, "x-api-key", "k") // the budget is back
	d.feed(`{"n":1}`, true)
	d.done()
	// 100 − 1 − 1 − 10 − 1 (k2 is another bucket).
	r := e.doUpstream(upstream{status: "200"}, "x-api-key", "k")
	if got := r.headers["ratelimit-remaining"]; got != "77" {
		t.Errorf("remaining %q, want 77", got)
	}
}
