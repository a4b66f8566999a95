package engine_test

import (
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// TestFailedCallNamesTheCause: the line logged for a failed limit-service
// call quotes the start of a non-200 answer's body, where Envoy (a refused
// connection, a timeout) or the service (its store is down) says why,
// bounded and with control characters blanked.
func TestFailedCallNamesTheCause(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer *engine.Answer
		want   string
	}{
		{"connection refused", &engine.Answer{Status: "503", Body: []byte("upstream connect error or disconnect/reset before headers. reset reason: remote connection failure")},
			"limit service limitd: status 503: upstream connect error or disconnect/reset before headers. reset reason: remote connection failure (failure_mode deny)"},
		{"timeout", &engine.Answer{Status: "504", Body: []byte("upstream request timeout")},
			"limit service limitd: status 504: upstream request timeout (failure_mode deny)"},
		{"store down", &engine.Answer{Status: "503", Body: []byte(`{"error":"dial tcp 127.0.0.1:6379: connect: connection refused"}` + "\n")},
			`limit service limitd: status 503: {"error":"dial tcp 127.0.0.1:6379: connect: connection refused"} (failure_mode deny)`},
		{"no body", &engine.Answer{Status: "502"}, "limit service limitd: status 502 (failure_mode deny)"},
		{"control characters", &engine.Answer{Status: "500", Body: []byte("a\r\nb\x00c\xffd")}, "limit service limitd: status 500: a  b cd (failure_mode deny)"},
		{"long body", &engine.Answer{Status: "500", Body: []byte(strings.Repeat("x", 5000))},
			"limit service limitd: status 500: " + strings.Repeat("x", engine.MaxExcerpt) + "… (failure_mode deny)"},
		{"no answer", &engine.Answer{Failed: true}, "limit service limitd: no answer (the call was reset, or Envoy would not send it) (failure_mode deny)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := fakehost.New()
			p := newPlugin(t, h, fleet)
			s := newStream()
			p.NewRequest(s).OnRequestHeaders()
			s.Calls[0].Answer(tc.answer)
			if len(h.Logs) != 1 || h.Logs[0] != engine.Name+": "+tc.want {
				t.Fatalf("logged %q, want %q", h.Logs, engine.Name+": "+tc.want)
			}
		})
	}
}
