package engine

import (
	"slices"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine/jsonpath"
)

// found is what a target found in a stream.
type found struct {
	found, ok, final bool
	cost             float64
}

// scan feeds stream to a fresh eventStream in chunks cut at the given
// offsets and returns what the target found after the end, checking the
// memory bound after every chunk.
func scan(t *testing.T, stream string, cuts []int, max int) found {
	t.Helper()
	var s eventStream
	tg := []bodyTarget{{path: jsonpath.NewPath("n"), max: max}}
	tg[0].reset()
	prev := 0
	for _, c := range append(cuts, len(stream)) {
		if c < prev || c > len(stream) {
			continue
		}
		s.write([]byte(stream[prev:c]), tg)
		prev = c
		if r := tg[0].scan.Retained(); r > jsonpath.MaxValue {
			t.Fatalf("kept %d bytes, bound %d", r, jsonpath.MaxValue)
		}
	}
	s.end(tg)
	return found{tg[0].found, tg[0].ok, tg[0].final, tg[0].cost}
}

// reference is the last complete event's value at "n", and whether an end
// event (data "[DONE]", or a type of endTypes) came after it or with it,
// read by a plain whole-stream reading of the event-stream format, each
// event's data scanned whole.
func reference(stream string, max int) found {
	tg := bodyTarget{path: jsonpath.NewPath("n"), max: max}
	tg.reset()
	stream = strings.ReplaceAll(stream, "\r\n", "\n")
	stream = strings.ReplaceAll(stream, "\r", "\n")
	lines := strings.Split(stream, "\n")
	lines = lines[:len(lines)-1] // the text after the last line end is no line
	var data []string
	typ, has := "", false
	for _, l := range lines {
		if l == "" {
			if has {
				d := strings.Join(data, "\n")
				if len(d) <= max {
					tg.write([]byte(d), len(d))
					tg.end()
				}
				if d == "[DONE]" || slices.Contains(endTypes[:], typ) {
					tg.final = tg.found
				}
			}
			data, typ, has = nil, "", false
			continue
		}
		field, value, found := strings.Cut(l, ":")
		if !found {
			field, value = l, ""
		}
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "data":
			data, has = append(data, value), true
		case "event":
			typ = value
		}
	}
	return found{tg.found, tg.ok, tg.final, tg.cost}
}

func TestEventStream(t *testing.T) {
	for _, tc := range []struct {
		name, stream     string
		found, ok, final bool
		cost             float64
	}{
		{"last of several", "data: {\"n\":1}\n\ndata: {\"n\":7}\n\ndata: [DONE]\n\n", true, true, true, 7},
		{"CRLF and CR", "data: {\"n\":1}\r\n\r\ndata: {\"n\":8}\r\rdata: {\"m\":1}\r\n\r\n", true, true, false, 8},
		{"multi-line data", "data: {\"n\":\ndata: 9}\n\n", true, true, false, 9},
		{"comments and fields", ": hi\nevent: usage\nid: 3\ndata:{\"n\":4}\n\n", true, true, false, 4},
		{"a field named data-x is not data", "data-x: {\"n\":4}\n\n", false, false, false, 0},
		{"unfinished event dropped", "data: {\"n\":1}\n\ndata: {\"n\":5}\n", true, true, false, 1},
		{"last carrier malformed", "data: {\"n\":1}\n\ndata: {\"n\":\"x\"}\n\n", true, false, false, 0},
		{"string number", "data: {\"n\":\"12\"}\n\n", true, true, false, 12},
		// End events: what makes a count final.
		{"a partial count is running", "data: {\"n\":1}\n\ndata: {\"c\":\"stop\"}\n\n", true, true, false, 1},
		{"[DONE] without a space", "data: {\"n\":3}\n\ndata:[DONE]\n\n", true, true, true, 3},
		{"[DONE] unfinished", "data: {\"n\":3}\n\ndata: [DONE]\n", true, true, false, 3},
		{"[DONE] and more is not the end", "data: {\"n\":3}\n\ndata: [DONE] \n\n", true, true, false, 3},
		{"[DONE] on two lines is not the end", "data: {\"n\":3}\n\ndata: [DO\ndata: NE]\n\n", true, true, false, 3},
		{"a count after the end runs again", "data: {\"n\":3}\n\ndata: [DONE]\n\ndata: {\"n\":4}\n\n", true, true, false, 4},
		{"message_delta then message_stop", "event: message_delta\ndata: {\"n\":15}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", true, true, true, 15},
		{"message_delta alone", "event: message_delta\ndata: {\"n\":15}\n\n", true, true, false, 15},
		{"the type after the data", "data: {\"n\":2}\n\ndata: {}\nevent:message_stop\n\n", true, true, true, 2},
		{"the last type counts", "data: {\"n\":2}\n\nevent: message_stop\nevent: ping\ndata: {}\n\n", true, true, false, 2},
		{"a type is the event's only", "data: {\"n\":2}\n\nevent: message_stop\n\ndata: {}\n\n", true, true, false, 2},
		{"an end event without data is not dispatched", "data: {\"n\":2}\n\nevent: message_stop\n\n", true, true, false, 2},
		{"a prefix of an end type", "data: {\"n\":2}\n\nevent: message_sto\ndata: {}\n\n", true, true, false, 2},
		{"an end type and more", "data: {\"n\":2}\n\nevent: message_stopped\ndata: {}\n\n", true, true, false, 2},
		{"response.completed carries the count", "event: response.created\ndata: {\"n\":null}\n\nevent: response.completed\ndata: {\"n\":30}\n\n", true, true, true, 30},
		{"an end event before any count", "data: [DONE]\n\n", false, false, false, 0},
	} {
		got := scan(t, tc.stream, nil, 1<<10)
		if got != (found{tc.found, tc.ok, tc.final, tc.cost}) {
			t.Errorf("%s: %+v, want found %v ok %v final %v cost %v", tc.name, got, tc.found, tc.ok, tc.final, tc.cost)
		}
		if ref := reference(tc.stream, 1<<10); got != ref {
			t.Errorf("%s: %+v, the reference reading %+v", tc.name, got, ref)
		}
	}
	// An event larger than max is skipped; the one before stands.
	got := scan(t, "data: {\"n\":1}\n\ndata: {\"n\":2,\"pad\":\""+strings.Repeat("x", 100)+"\"}\n\n", nil, 32)
	if !got.found || got.cost != 1 {
		t.Errorf("past max: %+v, want the earlier event's 1", got)
	}
}

// FuzzEventStream: however a stream is cut into chunks, the scanner finds
// what a whole-stream reading finds, within its memory bound.
func FuzzEventStream(f *testing.F) {
	f.Add("data: {\"n\":1}\n\ndata: {\"n\":7}\n\n", 3, 11, 64)
	f.Add("data: {\"n\":\r\ndata: 9}\r\n\r\n: c\r\rdata:{\"n\":2}\n\n", 1, 20, 8)
	f.Add("data: {\"n\":5,\"p\":\"xxxxxxxxxxxxxx\"}\n\n", 7, 8, 16)
	f.Add("event: message_delta\ndata: {\"n\":15}\n\nevent:message_stop\r\ndata: {}\r\n\r\ndata: [DONE]\n\n", 30, 44, 64)
	f.Add("data: {\"n\":1}\n\nevent: response.completed\ndata: {\"n\":2}\n\nevent\ndata\n\n", 5, 40, 64)
	f.Fuzz(func(t *testing.T, stream string, a, b, max int) {
		if max < 1 || max > 1<<12 {
			max = 1 + (max&0xfff+0x1000)%0x1000
		}
		cuts := []int{a % (len(stream) + 1), b % (len(stream) + 1)}
		if cuts[0] < 0 {
			cuts[0] = -cuts[0]
		}
		if cuts[1] < 0 {
			cuts[1] = -cuts[1]
		}
		if cuts[0] > cuts[1] {
			cuts[0], cuts[1] = cuts[1], cuts[0]
		}
		got, whole, want := scan(t, stream, cuts, max), scan(t, stream, nil, max), reference(stream, max)
		if got != whole {
			t.Fatalf("cut at %v: %+v; whole: %+v", cuts, got, whole)
		}
		if got != want {
			t.Fatalf("scanner %+v, reference %+v", got, want)
		}
	})
}
