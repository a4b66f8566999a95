// Package jsonpath finds the value at one dotted path in a JSON document
// that arrives in chunks, in memory bounded by the path, never by the
// document.
//
// # Model
//
// A Path is the plain form package config accepts for response_json:
// dot-separated segments, each an object key; a segment of decimal digits
// also names an array element (so "choices.0.index" reads the first
// element of the array at "choices", and "a.0" also reads the key "0" of
// an object at "a").
//
// A Scanner is fed the document with Write, in pieces cut anywhere, and
// answered by End. It reads each byte once and keeps no part of the
// document except the target value's text (at most MaxValue bytes). Its
// state is a fixed-size struct: a depth counter, how many of the open
// containers lie on the path, the kind (object or array) of the first
// KnownDepth open containers, and the lexer's state. Nothing grows with the
// document's size or nesting.
//
// # Guarantees
//
// The answer does not depend on where the document was cut. For a document
// nested at most KnownDepth deep, End reports the value at the path exactly
// as decoding the document with encoding/json (into any, numbers kept as
// json.Number) and walking the path would: an invalid document holds
// nothing; a duplicate key resolves to its last occurrence (a later
// occurrence replaces all an earlier one held, even when it does not hold
// the rest of the path). Containers nested deeper than KnownDepth are
// checked for balanced brackets and for the syntax of their strings,
// numbers and literals, not for the order of their commas and colons.
//
// The zero Scanner holds no path; a Scanner is not safe for concurrent use.
package jsonpath

import (
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"
)

const (
	// MaxValue is the most bytes of the target value kept: a number's
	// literal, or a string's decoded text. A longer one is reported as
	// Other.
	MaxValue = 64
	// KnownDepth is how many nested containers have their kind remembered
	// (one bit each); deeper ones are checked as the package doc says.
	KnownDepth = 1024
)

// Kind is what End found at the path.
type Kind uint8

// The kinds of a Value.
const (
	Absent Kind = iota // no value at the path, or the document is not valid JSON
	Number             // Text is the number's literal
	String             // Text is the decoded string
	Other              // an object, array, true, false or null; or a number or string longer than MaxValue
)

// Value is the answer of End. Text is valid until the next Write or Reset.
// In a String's Text, an escaped character outside ASCII is written in
// UTF-8, and an escaped surrogate as U+FFFD: Text is for reading numbers.
type Value struct {
	Kind Kind
	Text []byte
}

// Path is a compiled dotted path. The zero Path has no segment.
type Path struct {
	segs  []string
	index []int // the array index a segment names, or -1
}

// NewPath compiles p. It does not validate the segments (package config
// does): a segment that is empty or holds a character other than the
// config's names only matches a key spelled the same way.
func NewPath(p string) *Path {
	segs := strings.Split(p, ".")
	x := &Path{segs: segs, index: make([]int, len(segs))}
	for i, s := range segs {
		x.index[i] = arrayIndex(s)
	}
	return x
}

// arrayIndex is the array element a segment names, or -1.
func arrayIndex(s string) int {
	if s == "" {
		return -1
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return -1
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// String returns the path as written.
func (p *Path) String() string { return strings.Join(p.segs, ".") }

// grammar states between tokens.
const (
	stValue        uint8 = iota // a value
	stValueOrClose              // after '[': a value or ']'
	stKeyOrClose                // after '{': a key or '}'
	stKey                       // after ',' in an object: a key
	stColon                     // after a key
	stAfter                     // after a value: ',' or a closer (at the root: nothing)
	stLoose                     // inside a container deeper than KnownDepth
)

// lexer states within a token.
const (
	lxNone uint8 = iota
	lxString
	lxNumber
	lxLiteral
)

// number states: which part of a number was read last.
const (
	nmSign  uint8 = iota // '-'
	nmZero               // a leading 0
	nmInt                // integer digits
	nmDot                // '.'
	nmFrac               // fraction digits
	nmE                  // 'e' or 'E'
	nmESign              // the exponent's sign
	nmExp                // exponent digits
)

// Scanner finds the value at a Path in a document fed to it in pieces.
type Scanner struct {
	path  *Path
	depth int // containers open
	on    int // containers 1..on lie on the path (on <= depth)
	elem  int // the element being read in the on-path array at depth on
	kinds [KnownDepth / 64]uint64

	st uint8
	lx uint8
	// strings
	key    bool // the string is a key of the on-path object at depth on
	keyPos int  // key: bytes matched of the segment; -1 when it cannot match
	esc    int  // 0, or 1 after '\', or 2 + hex digits read of \uXXXX
	code   rune
	// keyMatched: the last key read names the path's next segment.
	keyMatched bool
	// numbers and literals
	num    uint8
	lit    string
	litPos int
	// the target value
	capture bool
	val     [MaxValue]byte
	vlen    int
	over    bool
	found   bool
	kind    Kind

	done bool // the root value is complete
	err  bool // not valid JSON
}

// Reset makes s ready for a new document at path p (nil: no path, so the
// scan only checks the syntax).
func (s *Scanner) Reset(p *Path) {
	*s = Scanner{path: p}
}

// Failed reports whether what was written is already not valid JSON: End
// will report Absent whatever comes next.
func (s *Scanner) Failed() bool { return s.err }

// Retained is the bytes of the document s holds: the target value's text so
// far, never more than MaxValue.
func (s *Scanner) Retained() int { return s.vlen }

func (s *Scanner) isArray(d int) bool {
	d--
	return s.kinds[d/64]&(1<<(d%64)) != 0
}

func (s *Scanner) nsegs() int {
	if s.path == nil {
		return -1
	}
	return len(s.path.segs)
}

// Write scans the next piece of the document.
func (s *Scanner) Write(p []byte) {
	for i := 0; i < len(p) && !s.err; {
		switch s.lx {
		case lxString:
			i = s.str(p, i)
			continue
		case lxNumber:
			if s.number(p[i]) {
				i++
				continue
			}
			// the byte ends the number: it is read again below
		case lxLiteral:
			if p[i] != s.lit[s.litPos] {
				s.err = true
				return
			}
			s.litPos++
			i++
			if s.litPos == len(s.lit) {
				s.lx = lxNone
				s.endValue()
			}
			continue
		}
		s.structural(p[i])
		i++
	}
}

// str reads string bytes from p[i:] and returns where it stopped.
func (s *Scanner) str(p []byte, i int) int {
	track := s.capture || (s.key && s.keyPos >= 0)
	if s.esc == 0 && !track {
		// Fast path: nothing of the string is kept. Sixteen, then eight
		// bytes at a time while none of them ends the run (plainRun),
		// then byte by byte.
		if i+8 <= len(p) {
			base := unsafe.Pointer(unsafe.SliceData(p))
			for i+16 <= len(p) && plainRun(word(base, i)) && plainRun(word(base, i+8)) {
				i += 16
			}
			for i+8 <= len(p) && plainRun(word(base, i)) {
				i += 8
			}
		}
		for i < len(p) {
			c := p[i]
			if c == '"' || c == '\\' || c < 0x20 {
				break
			}
			i++
		}
		if i == len(p) {
			return i
		}
	}
	c := p[i]
	switch {
	case s.esc == 1:
		switch c {
		case '"', '\\', '/':
			s.emit(c)
		case 'b':
			s.emit('\b')
		case 'f':
			s.emit('\f')
		case 'n':
			s.emit('\n')
		case 'r':
			s.emit('\r')
		case 't':
			s.emit('\t')
		case 'u':
			s.esc, s.code = 2, 0
			return i + 1
		default:
			s.err = true
		}
		s.esc = 0
	case s.esc >= 2:
		var h rune
		switch {
		case '0' <= c && c <= '9':
			h = rune(c - '0')
		case 'a' <= c && c <= 'f':
			h = rune(c-'a') + 10
		case 'A' <= c && c <= 'F':
			h = rune(c-'A') + 10
		default:
			s.err = true
			return i
		}
		s.code = s.code<<4 | h
		s.esc++
		if s.esc == 6 {
			s.esc = 0
			s.emitRune(s.code)
		}
	case c == '"':
		s.lx = lxNone
		s.endString()
	case c == '\\':
		s.esc = 1
	case c < 0x20:
		s.err = true
	default:
		s.emit(c)
	}
	return i + 1
}

// word is the eight bytes at base+i, in the machine's order (plainRun does
// not care which): the caller has checked that they lie within its slice.
// A single load: in a Wasm VM, where a body's scan is mostly this loop,
// byte loads and shifts (encoding/binary) cost 1.5 times as much.
func word(base unsafe.Pointer, i int) uint64 { return *(*uint64)(unsafe.Add(base, i)) }

// plainRun reports whether none of the eight bytes of v ends a run of plain
// string bytes: none is '"', '\\' or a control byte (below 0x20). Each
// test is the classic one for a zero byte, (x − 0x01…) &^ x & 0x80…, on v
// xor the byte, and on v less 0x20 for the control bytes; none reports a
// byte that does not match, so a run is never cut early nor read too far.
func plainRun(v uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q, b := v^(ones*'"'), v^(ones*'\\')
	return ((q-ones)&^q|(b-ones)&^b|(v-ones*0x20)&^v)&highs == 0
}

// emit takes one decoded byte of a string.
func (s *Scanner) emit(c byte) {
	if s.capture {
		if s.vlen < MaxValue {
			s.val[s.vlen] = c
			s.vlen++
		} else {
			s.over = true
		}
	}
	if s.key && s.keyPos >= 0 {
		seg := s.path.segs[s.depth-1]
		if s.keyPos < len(seg) && seg[s.keyPos] == c {
			s.keyPos++
		} else {
			s.keyPos = -1
		}
	}
}

// emitRune takes one character written as \uXXXX.
func (s *Scanner) emitRune(r rune) {
	if r < utf8.RuneSelf {
		s.emit(byte(r))
		return
	}
	if s.key {
		s.keyPos = -1 // segments are ASCII
	}
	if s.capture {
		var b [utf8.UTFMax]byte
		n := utf8.EncodeRune(b[:], r) // a lone surrogate becomes U+FFFD
		for _, c := range b[:n] {
			s.emit(c)
		}
	}
}

// endString ends a key or a string value.
func (s *Scanner) endString() {
	if s.st == stKey || s.st == stKeyOrClose {
		s.keyMatched = s.key && s.keyPos >= 0 && s.keyPos == len(s.path.segs[s.depth-1])
		s.key = false
		s.st = stColon
		return
	}
	s.endValue()
}

// number reads one byte of a number; false when c is not part of it (the
// number ends there, or the document is invalid).
func (s *Scanner) number(c byte) bool {
	digit := '0' <= c && c <= '9'
	next := s.num
	switch s.num {
	case nmSign:
		switch {
		case c == '0':
			next = nmZero
		case digit:
			next = nmInt
		default:
			s.err = true
			return false
		}
	case nmZero, nmInt:
		switch {
		case digit && s.num == nmInt:
			next = nmInt
		case digit: // a digit after a leading 0
			s.err = true
			return false
		case c == '.':
			next = nmDot
		case c == 'e' || c == 'E':
			next = nmE
		default:
			return s.endNumber()
		}
	case nmDot, nmFrac:
		switch {
		case digit:
			next = nmFrac
		case s.num == nmDot:
			s.err = true
			return false
		case c == 'e' || c == 'E':
			next = nmE
		default:
			return s.endNumber()
		}
	case nmE, nmESign:
		switch {
		case digit:
			next = nmExp
		case s.num == nmE && (c == '+' || c == '-'):
			next = nmESign
		default:
			s.err = true
			return false
		}
	case nmExp:
		if !digit {
			return s.endNumber()
		}
	}
	s.num = next
	s.emit(c)
	return true
}

// endNumber ends a number whose last byte was read; false, as number's
// answer for the byte after it.
func (s *Scanner) endNumber() bool {
	s.lx = lxNone
	s.endValue()
	return false
}

// onPath reports whether the value starting now lies on the path, and its
// prefix (the segments it is the value of).
func (s *Scanner) onPath() (bool, int) {
	if s.path == nil || s.depth != s.on || s.depth > KnownDepth {
		return false, 0
	}
	if s.depth == 0 {
		return true, 0
	}
	if s.isArray(s.depth) {
		return s.elem == s.path.index[s.depth-1], s.depth
	}
	return s.keyMatched, s.depth
}

// startValue reads the first byte of a value.
func (s *Scanner) startValue(c byte) {
	on, prefix := s.onPath()
	target := on && prefix == s.nsegs()
	if on {
		// A later occurrence replaces whatever an earlier one held.
		s.found, s.kind, s.capture, s.vlen, s.over = false, Absent, false, 0, false
	}
	switch c {
	case '{', '[':
		if target {
			s.found, s.kind = true, Other
		}
		s.depth++
		if s.depth > KnownDepth {
			s.st = stLoose
			return
		}
		d := s.depth - 1
		if c == '[' {
			s.kinds[d/64] |= 1 << (d % 64)
			s.st = stValueOrClose
		} else {
			s.kinds[d/64] &^= 1 << (d % 64)
			s.st = stKeyOrClose
		}
		if on && !target && (c == '{' || s.path.index[prefix] >= 0) {
			s.on, s.elem = s.depth, 0
		}
		return
	case '"':
		s.lx, s.key = lxString, false
		if target {
			s.capture, s.kind = true, String
		}
		return
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		s.lx, s.num = lxNumber, nmInt
		switch c {
		case '-':
			s.num = nmSign
		case '0':
			s.num = nmZero
		}
		if target {
			s.capture, s.kind = true, Number
		}
		s.emit(c)
		return
	case 't':
		s.lx, s.lit, s.litPos = lxLiteral, "true", 1
	case 'f':
		s.lx, s.lit, s.litPos = lxLiteral, "false", 1
	case 'n':
		s.lx, s.lit, s.litPos = lxLiteral, "null", 1
	default:
		s.err = true
		return
	}
	if target {
		s.kind = Other
		s.capture = true // found when the literal ends
	}
}

// endValue follows the end of a scalar value.
func (s *Scanner) endValue() {
	if s.capture {
		s.capture = false
		s.found = true
		if s.over {
			s.kind = Other
		}
	}
	s.afterValue()
}

// afterValue sets the state after a complete value.
func (s *Scanner) afterValue() {
	switch {
	case s.depth > KnownDepth:
		s.st = stLoose
	case s.depth == 0:
		s.done = true
		s.st = stAfter
	default:
		s.st = stAfter
	}
}

// closeContainer closes the innermost container with c.
func (s *Scanner) closeContainer(c byte) {
	if s.depth <= KnownDepth && s.isArray(s.depth) != (c == ']') {
		s.err = true
		return
	}
	if s.on == s.depth {
		s.on--
		s.keyMatched = false
		if s.on > 0 && s.isArray(s.on) {
			// Back in the on-path array: the element just closed was
			// the one the path names.
			s.elem = s.path.index[s.on-1]
		}
	}
	s.depth--
	s.afterValue()
}

// structural reads one byte between tokens.
func (s *Scanner) structural(c byte) {
	if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
		return
	}
	switch s.st {
	case stValue:
		s.startValue(c)
	case stValueOrClose:
		if c == ']' {
			s.closeContainer(c)
			return
		}
		s.startValue(c)
	case stKeyOrClose, stKey:
		switch {
		case c == '"':
			s.lx = lxString
			s.key = s.depth == s.on && s.path != nil
			s.keyPos = 0
		case c == '}' && s.st == stKeyOrClose:
			s.closeContainer(c)
		default:
			s.err = true
		}
	case stColon:
		if c != ':' {
			s.err = true
			return
		}
		s.st = stValue
	case stAfter:
		switch {
		case s.depth == 0:
			s.err = true // only white space after the document
		case c == ',' && s.isArray(s.depth):
			if s.depth == s.on {
				s.elem++
			}
			s.st = stValue
		case c == ',':
			s.keyMatched = false
			s.st = stKey
		case c == ']' || c == '}':
			s.closeContainer(c)
		default:
			s.err = true
		}
	case stLoose:
		switch c {
		case ',', ':':
		case ']', '}':
			s.closeContainer(c)
		default:
			s.startValue(c)
		}
	}
}

// End reports the value at the path in the document written so far, taken
// as the whole document.
func (s *Scanner) End() Value {
	if s.lx == lxNumber && !s.err {
		switch s.num {
		case nmZero, nmInt, nmFrac, nmExp:
			s.lx = lxNone
			s.endValue()
		}
	}
	if s.err || !s.done || s.lx != lxNone || !s.found {
		return Value{}
	}
	if s.kind != Number && s.kind != String {
		return Value{Kind: s.kind}
	}
	return Value{Kind: s.kind, Text: s.val[:s.vlen]}
}
