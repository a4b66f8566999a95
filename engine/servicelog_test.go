package engine

import (
	"strings"
	"testing"
)

// TestFailedCallNamesTheCause: the line logged for a failed limit-service
// call quotes the start of a non-200 answer's body, where Envoy (a refused
// connection, a timeout) or the service (its store is down) says why,
// bounded and with control characters blanked.
func TestFailedCallNamesTheCause(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer *Answer
		want   string
	}{
		{"connection refused", &Answer{Status: "503", Body: []byte("upstream connect error or disconnect/reset before headers. reset reason: remote connection failure")},
			"limit service limitd: status 503: upstream connect error or disconnect/reset before headers. reset reason: remote connection failure (failure_mode deny)"},
		{"timeout", &Answer{Status: "504", Body: []byte("upstream request timeout")},
			"limit service limitd: status 504: upstream request timeout (failure_mode deny)"},
		{"store down", &Answer{Status: "503", Body: []byte(`{"error":"dial tcp 127.0.0.1:6379: connect: connection refused"}` + "\n")},
			`limit service limitd: status 503: {"error":"dial tcp 127.0.0.1:6379: connect: connection refused"} (failure_mode deny)`},
		{"no body", &Answer{Status: "502"}, "limit service limitd: status 502 (failure_mode deny)"},
		{"control characters", &Answer{Status: "500", Body: []byte("a\r\nb\x00c\xffd")}, "limit service limitd: status 500: a  b cd (failure_mode deny)"},
		{"long body", &Answer{Status: "500", Body: []byte(strings.Repeat("x", 5000))},
			"limit service limitd: status 500: " + strings.Repeat("x", maxExcerpt) + "… (failure_mode deny)"},
		{"no answer", &Answer{Failed: true}, "limit service limitd: no answer (the call was reset, or Envoy would not send it) (failure_mode deny)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost()
			p := newPlugin(t, h, fleet)
			s := newFakeStream()
			p.NewRequest(s).OnRequestHeaders()
			s.calls[0].answer(tc.answer)
			if len(h.logs) != 1 || h.logs[0] != Name+": "+tc.want {
				t.Fatalf("logged %q, want %q", h.logs, Name+": "+tc.want)
			}
		})
	}
}
