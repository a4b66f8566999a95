package engine

import (
	"math"
	"strconv"
	"unsafe"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/engine/jsonpath"
)

// bodyTarget is one JSON path looked up in a response body, or in every
// event of an event stream, and what was found. Its scanner is fed the
// document as it passes (package jsonpath): nothing of the document is
// kept but the value's text (at most jsonpath.MaxValue bytes).
type bodyTarget struct {
	path *jsonpath.Path
	max  int // the largest body (or event data) read for it
	scan jsonpath.Scanner
	// skip: the document being read is past max, or not JSON: it is not
	// fed further.
	skip bool
	// found: a document (the body, or an event's data) within max held the
	// path; for a stream, cost and ok are those of the last such event.
	found bool
	ok    bool // the value is a cost
	// final: the stream marked its end (an end event, see eventStream)
	// after, or with, the event that gave cost: cost is the stream's bill,
	// not a running count.
	final bool
	cost  float64
}

// ScanBytes is what one response_json target's scan holds, in bytes, for
// the budget of in-flight scans (maxBodyHeld, Options.BodyBudget).
const ScanBytes = int(unsafe.Sizeof(bodyTarget{}))

// reset makes the target ready for the next document.
func (t *bodyTarget) reset() {
	t.scan.Reset(t.path)
	t.skip = false
}

// write feeds the next piece of the document, which is size bytes long
// so far (this piece included).
func (t *bodyTarget) write(piece []byte, size int) {
	if t.skip {
		return
	}
	if size > t.max {
		t.skip = true // past the bound: never read
		return
	}
	t.scan.Write(piece)
	if t.scan.Failed() {
		t.skip = true // not JSON: nothing more to learn
	}
}

// end ends the document: when it held the path, the target takes its
// value, replacing an earlier document's (a value not yet marked final).
func (t *bodyTarget) end() {
	if !t.skip {
		if v := t.scan.End(); v.Kind != jsonpath.Absent {
			t.found, t.final = true, false
			t.cost, t.ok = responseCost(v)
		}
	}
	t.reset()
}

// eventStream scans a text/event-stream response as its chunks pass, for
// the value at each target's path in the data of its events. It keeps no
// line and no event: the data of a data line goes to the targets' scanners
// as it arrives (lines of one event joined by LF), so a stream of any
// length, with lines and events of any size, costs the targets' fixed
// state. Events are read as the WHATWG server-sent events format says:
// lines end in LF, CRLF or CR; a blank line ends an event; the data of an
// event is its "data:" lines (one leading space dropped) joined by LF; its
// type is its last "event:" line's value (one leading space dropped); an
// event with no data line is not dispatched; other fields and comments are
// ignored. An event whose data is larger than a target's max is skipped
// for that target; an event not ended by a blank line is dropped.
//
// An end event marks the stream's end: its data is exactly "[DONE]" (the
// OpenAI chat completions format and those that copy it), or its type is
// one of endTypes. The last cost found up to and with an end event is
// final (bodyTarget.final): a later event at the path is a running count
// again. The zero eventStream is ready for use.
type eventStream struct {
	state   uint8
	field   int   // bytes of the field name read
	names   uint8 // fieldData, fieldEvent: the names the field read so far may still be
	hasData bool  // the event has a data line
	size    int   // bytes of the event's data so far
	cr      bool  // the previous byte was CR: an LF right after it ends nothing
	// done is how many bytes of the event's data match "[DONE]", or -1
	// once they cannot.
	done int
	// The event's type as matched against endTypes: typeLen bytes read,
	// typeOf holds bit i while they are a prefix of endTypes[i].
	typeLen int
	typeOf  uint8
}

// endTypes are the event types that end a stream: the Anthropic Messages
// API's message_stop (after message_delta, whose usage is cumulative), and
// the OpenAI Responses API's terminal events (which carry the usage
// themselves, with no [DONE] after them).
var endTypes = [...]string{"message_stop", "response.completed", "response.incomplete", "response.failed"}

// endData is the data of the OpenAI chat completions format's end event.
const endData = "[DONE]"

// Field names an eventStream reads (eventStream.names).
const (
	fieldData uint8 = 1 << iota
	fieldEvent
)

// line states of an eventStream.
const (
	lineStart  uint8 = iota // nothing of the line read
	lineField               // the field name, a prefix of "data" or "event" so far
	lineSpace               // after "data:": one space is dropped
	lineData                // the data line's value
	lineTypeSp              // after "event:": one space is dropped
	lineType                // the event line's value
	lineIgnore              // another field, or a comment
)

// write scans one chunk.
func (s *eventStream) write(chunk []byte, targets []bodyTarget) {
	for len(chunk) > 0 {
		c := chunk[0]
		if s.cr && c == '\n' {
			s.cr = false
			chunk = chunk[1:]
			continue
		}
		s.cr = false
		if c == '\n' || c == '\r' {
			s.cr = c == '\r'
			s.endLine(targets)
			chunk = chunk[1:]
			continue
		}
		switch s.state {
		case lineStart, lineField:
			if s.state == lineStart {
				s.state, s.names = lineField, fieldData|fieldEvent
			}
			s.fieldByte(c, targets)
			chunk = chunk[1:]
		case lineSpace, lineTypeSp:
			if s.state == lineSpace {
				s.state = lineData
			} else {
				s.state = lineType
			}
			if c == ' ' {
				chunk = chunk[1:]
			}
		case lineData:
			i := lineEnd(chunk)
			s.feed(chunk[:i], targets)
			chunk = chunk[i:]
		case lineType:
			i := lineEnd(chunk)
			s.typeBytes(chunk[:i])
			chunk = chunk[i:]
		default: // lineIgnore
			chunk = chunk[lineEnd(chunk):]
		}
	}
}

// lineEnd is the length of chunk up to its first CR or LF.
func lineEnd(chunk []byte) int {
	i := 0
	for i < len(chunk) && chunk[i] != '\n' && chunk[i] != '\r' {
		i++
	}
	return i
}

// fieldByte reads one byte of a field name, or the colon after it.
func (s *eventStream) fieldByte(c byte, targets []bodyTarget) {
	const data, event = "data", "event"
	if c == ':' {
		switch {
		case s.names&fieldData != 0 && s.field == len(data):
			s.state = lineSpace
			s.startData(targets)
		case s.names&fieldEvent != 0 && s.field == len(event):
			s.state = lineTypeSp
			s.startType()
		default:
			s.state = lineIgnore
		}
		return
	}
	if s.field >= len(data) || data[s.field] != c {
		s.names &^= fieldData
	}
	if s.field >= len(event) || event[s.field] != c {
		s.names &^= fieldEvent
	}
	s.field++
	if s.names == 0 {
		s.state = lineIgnore
	}
}

// startData begins a data line's value: after the first, an LF joins it to
// the event's data.
func (s *eventStream) startData(targets []bodyTarget) {
	if s.hasData {
		s.feed(lf, targets)
	}
	s.hasData = true
}

// startType begins an event line's value: it replaces the event's type.
func (s *eventStream) startType() {
	s.typeLen, s.typeOf = 0, 1<<len(endTypes)-1
}

// typeBytes reads bytes of the event's type.
func (s *eventStream) typeBytes(p []byte) {
	for _, c := range p {
		if s.typeOf == 0 {
			return
		}
		for i, t := range endTypes {
			if s.typeOf&(1<<i) != 0 && (s.typeLen >= len(t) || t[s.typeLen] != c) {
				s.typeOf &^= 1 << i
			}
		}
		s.typeLen++
	}
}

// feed passes data bytes of the event to every target.
func (s *eventStream) feed(p []byte, targets []bodyTarget) {
	if len(p) == 0 {
		return
	}
	if s.done >= 0 {
		if len(p) <= len(endData)-s.done && string(p) == endData[s.done:s.done+len(p)] {
			s.done += len(p)
		} else {
			s.done = -1
		}
	}
	s.size += len(p)
	for i := range targets {
		targets[i].write(p, s.size)
	}
}

var lf = []byte{'\n'}

// endLine handles the end of a line.
func (s *eventStream) endLine(targets []bodyTarget) {
	switch s.state {
	case lineStart: // a blank line ends the event
		if s.hasData {
			for i := range targets {
				targets[i].end()
			}
			if s.ends() {
				for i := range targets {
					targets[i].final = targets[i].found
				}
			}
		}
		s.hasData, s.size, s.done, s.typeOf = false, 0, 0, 0
	case lineField:
		switch {
		case s.names&fieldData != 0 && s.field == len("data"): // "data" alone: a data line with no value
			s.startData(targets)
		case s.names&fieldEvent != 0 && s.field == len("event"): // "event" alone: an empty type
			s.startType()
		}
	}
	s.state, s.field = lineStart, 0
}

// ends reports whether the event being dispatched is an end event.
func (s *eventStream) ends() bool {
	if s.done == len(endData) {
		return true
	}
	for i, t := range endTypes {
		if s.typeOf&(1<<i) != 0 && s.typeLen == len(t) {
			return true
		}
	}
	return false
}

// end finishes the stream: an event not ended by a blank line is dropped,
// as the format says.
func (s *eventStream) end(targets []bodyTarget) {
	for i := range targets {
		targets[i].reset()
	}
	*s = eventStream{}
}

// responseCost reads a cost reported by a response: a finite number, 0 or
// at least config.MinCost, written as a JSON number or as a string holding
// one (a header's value is the latter). Unlike a request's cost, 0 is a
// cost: the upstream says nothing was spent. A positive value below
// MinCost is not, as for a request's cost: such a value would refund
// nearly the whole reservation.
func responseCost(v jsonpath.Value) (float64, bool) {
	switch v.Kind {
	case jsonpath.Number, jsonpath.String:
		return parseResponseCost(string(v.Text))
	}
	return 0, false
}

// parseResponseCost is responseCost for a header's text.
func parseResponseCost(s string) (float64, bool) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f == 0 || f >= config.MinCost) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}
