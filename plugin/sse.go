package plugin

import (
	"math"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonlimit"
)

// maxBodyDepth bounds the nesting of a response body (or of one event's
// data) before gjson's validator, which recurses once per level, sees it:
// the upstream's body is untrusted input. A usage object needs 3 levels.
const maxBodyDepth = 64

// eventStream scans a text/event-stream response as its chunks pass, for
// the value at one JSON path in the data of its events: it keeps only the
// event being read (at most max bytes of it) and the last value found, so
// a stream of any length costs bounded memory, and no chunk waits for the
// next. Events are read as the WHATWG server-sent events format says:
// lines end in LF, CRLF or CR; a blank line ends an event; the data of an
// event is its "data:" lines (one leading space dropped) joined by LF;
// other fields and comments are ignored. An event whose data is larger
// than max bytes is skipped. The zero eventStream is ready for use.
type eventStream struct {
	line     []byte // the line being read, up to max bytes
	data     []byte // the data of the event being read, up to max bytes
	hasData  bool   // the event has a data line
	tooLong  bool   // the event (or its current line) went past max
	lineLong bool   // the current line went past max
	longData bool   // ... and it is a data line
	cr       bool   // the previous byte was CR: an LF right after it ends nothing
}

// bodyTarget is one JSON path looked up in a response body, or in every
// event of an event stream, and what was found.
type bodyTarget struct {
	path string
	max  int // the largest body (or event data) read for it
	// found: a document (the body, or an event's data) within max held the
	// path; for a stream, cost and ok are those of the last such event.
	found bool
	ok    bool // the value is a cost
	cost  float64
}

// see looks the target's path up in doc.
func (t *bodyTarget) see(doc []byte) {
	if len(doc) > t.max {
		return
	}
	if v, ok := lookup(doc, t.path); ok {
		t.found = true
		t.cost, t.ok = responseCost(v)
	}
}

// write scans one chunk: each complete event's data is shown to every
// target. max bounds the event data kept (the largest of the targets').
func (s *eventStream) write(chunk []byte, max int, targets []bodyTarget) {
	for len(chunk) > 0 {
		if s.cr && chunk[0] == '\n' {
			s.cr = false
			chunk = chunk[1:]
			continue
		}
		s.cr = false
		i := 0
		for i < len(chunk) && chunk[i] != '\n' && chunk[i] != '\r' {
			i++
		}
		if !s.lineLong {
			if len(s.line)+i > max+len("data: ") {
				// Only a data line past the bound spoils its event.
				s.lineLong = true
				s.longData = startsData(s.line, chunk[:i])
				s.line = s.line[:0]
			} else {
				s.line = append(s.line, chunk[:i]...)
			}
		}
		if i == len(chunk) {
			return // the line goes on in the next chunk
		}
		s.cr = chunk[i] == '\r'
		s.endLine(max, targets)
		chunk = chunk[i+1:]
	}
}

// end finishes the stream: an event not ended by a blank line is dropped,
// as the format says.
func (s *eventStream) end() {
	s.line, s.data = s.line[:0], s.data[:0]
	s.hasData, s.tooLong, s.lineLong = false, false, false
}

// endLine handles a complete line.
func (s *eventStream) endLine(max int, targets []bodyTarget) {
	line, long := s.line, s.lineLong
	s.line, s.lineLong = s.line[:0], false
	if len(line) == 0 && !long {
		s.dispatch(targets)
		return
	}
	if long {
		if s.longData {
			s.tooLong = true // its data is past the bound: the event is skipped
		}
		return
	}
	field, value := line, []byte(nil)
	for i, b := range line {
		if b == ':' {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
			break
		}
	}
	if string(field) != "data" || s.tooLong {
		return // another field, a comment (empty field), or a skipped event
	}
	if s.hasData {
		s.data = append(s.data, '\n')
	}
	s.hasData = true
	if len(s.data)+len(value) > max {
		s.tooLong = true
		s.data = s.data[:0]
		return
	}
	s.data = append(s.data, value...)
}

// dispatch ends an event: every target whose path its data holds takes
// the value.
func (s *eventStream) dispatch(targets []bodyTarget) {
	if s.hasData && !s.tooLong {
		for i := range targets {
			targets[i].see(s.data)
		}
	}
	s.data = s.data[:0]
	s.hasData, s.tooLong = false, false
}

// lookup returns the value at path in a JSON document, if the document is
// valid JSON (nested at most maxBodyDepth deep) holding path.
func lookup(doc []byte, path string) (gjson.Result, bool) {
	if _, ok := jsonlimit.Check(doc, maxBodyDepth); !ok || !gjson.ValidBytes(doc) {
		return gjson.Result{}, false
	}
	v := gjson.GetBytes(doc, path)
	return v, v.Exists()
}

// responseCost reads a cost reported by a response: a finite number >= 0,
// written as a JSON number or as a string holding one (a header's value is
// the latter). Unlike a request's cost, 0 is a cost: the upstream says
// nothing was spent.
func responseCost(v gjson.Result) (float64, bool) {
	var f float64
	switch v.Type {
	case gjson.Number:
		f = v.Num
	case gjson.String:
		return parseResponseCost(v.Str)
	default:
		return 0, false
	}
	return f, f >= 0 && !math.IsInf(f, 0)
}

// parseResponseCost is responseCost for a header's text.
func parseResponseCost(s string) (float64, bool) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f >= 0) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// startsData reports whether the line a + b starts with the field name
// "data" followed by a colon (a line past the bound is longer than that).
func startsData(a, b []byte) bool {
	const field = "data:"
	for i := 0; i < len(field); i++ {
		var c byte
		switch {
		case i < len(a):
			c = a[i]
		case i-len(a) < len(b):
			c = b[i-len(a)]
		default:
			return false
		}
		if c != field[i] {
			return false
		}
	}
	return true
}
