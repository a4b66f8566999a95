package jsonlimit

import "strconv"

// SyntaxError describes why data is not JSON, with the byte offset, in the
// words of encoding/json's Unmarshal (its scanner's state machine, ported
// here so the plugin does not carry encoding/json and reflect for one error
// message; TestSyntaxErrorMatchesEncodingJSON and FuzzSyntaxError compare
// the two). A document encoding/json accepts is just "invalid JSON".
func SyntaxError(data []byte) error {
	s := scanner{step: stateBeginValue}
	for _, c := range data {
		s.bytes++
		if s.step(&s, c) == scanError {
			return s.err
		}
	}
	if s.eof() == scanError {
		return s.err
	}
	return &textError{"invalid JSON"}
}

// textError is an error with a fixed text.
type textError struct{ s string }

func (e *textError) Error() string { return e.s }

const (
	scanContinue = iota
	scanEnd
	scanError
)

const (
	parseObjectKey = iota
	parseObjectValue
	parseArrayValue
)

// maxNestingDepth is encoding/json's bound (Parse refuses documents nested
// deeper than MaxDepth before this runs).
const maxNestingDepth = 10000

type scanner struct {
	step       func(*scanner, byte) int
	endTop     bool
	parseState []int
	err        error
	bytes      int
}

func (s *scanner) eof() int {
	if s.err != nil {
		return scanError
	}
	if s.endTop {
		return scanEnd
	}
	s.step(s, ' ')
	if s.endTop {
		return scanEnd
	}
	if s.err == nil {
		s.err = &textError{"invalid JSON: unexpected end of JSON input (at byte " + strconv.Itoa(s.bytes) + ")"}
	}
	return scanError
}

func (s *scanner) pushParseState(c byte, newParseState int, successState int) int {
	s.parseState = append(s.parseState, newParseState)
	if len(s.parseState) <= maxNestingDepth {
		return successState
	}
	return s.error(c, "exceeded max depth")
}

func (s *scanner) popParseState() {
	n := len(s.parseState) - 1
	s.parseState = s.parseState[0:n]
	if n == 0 {
		s.step = stateEndTop
		s.endTop = true
	} else {
		s.step = stateEndValue
	}
}

func isSpace(c byte) bool {
	return c <= ' ' && (c == ' ' || c == '\t' || c == '\r' || c == '\n')
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func stateBeginValueOrEmpty(s *scanner, c byte) int {
	if isSpace(c) {
		return scanContinue
	}
	if c == ']' {
		return stateEndValue(s, c)
	}
	return stateBeginValue(s, c)
}

func stateBeginValue(s *scanner, c byte) int {
	if isSpace(c) {
		return scanContinue
	}
	switch c {
	case '{':
		s.step = stateBeginStringOrEmpty
		return s.pushParseState(c, parseObjectKey, scanContinue)
	case '[':
		s.step = stateBeginValueOrEmpty
		return s.pushParseState(c, parseArrayValue, scanContinue)
	case '"':
		s.step = stateInString
	case '-':
		s.step = stateNeg
	case '0':
		s.step = state0
	case 't':
		s.step = literal("true", 1, stateEndValue)
	case 'f':
		s.step = literal("false", 1, stateEndValue)
	case 'n':
		s.step = literal("null", 1, stateEndValue)
	default:
		if '1' <= c && c <= '9' {
			s.step = state1
			return scanContinue
		}
		return s.error(c, "looking for beginning of value")
	}
	return scanContinue
}

func stateBeginStringOrEmpty(s *scanner, c byte) int {
	if isSpace(c) {
		return scanContinue
	}
	if c == '}' {
		s.parseState[len(s.parseState)-1] = parseObjectValue
		return stateEndValue(s, c)
	}
	return stateBeginString(s, c)
}

func stateBeginString(s *scanner, c byte) int {
	if isSpace(c) {
		return scanContinue
	}
	if c == '"' {
		s.step = stateInString
		return scanContinue
	}
	return s.error(c, "looking for beginning of object key string")
}

func stateEndValue(s *scanner, c byte) int {
	n := len(s.parseState)
	if n == 0 {
		s.step = stateEndTop
		s.endTop = true
		return stateEndTop(s, c)
	}
	if isSpace(c) {
		s.step = stateEndValue
		return scanContinue
	}
	switch s.parseState[n-1] {
	case parseObjectKey:
		if c == ':' {
			s.parseState[n-1] = parseObjectValue
			s.step = stateBeginValue
			return scanContinue
		}
		return s.error(c, "after object key")
	case parseObjectValue:
		if c == ',' {
			s.parseState[n-1] = parseObjectKey
			s.step = stateBeginString
			return scanContinue
		}
		if c == '}' {
			s.popParseState()
			return scanContinue
		}
		return s.error(c, "after object key:value pair")
	default: // parseArrayValue
		if c == ',' {
			s.step = stateBeginValue
			return scanContinue
		}
		if c == ']' {
			s.popParseState()
			return scanContinue
		}
		return s.error(c, "after array element")
	}
}

// stateEndTop records an error but, as encoding/json's, does not return
// one: the next byte (or the end) reports it.
func stateEndTop(s *scanner, c byte) int {
	if !isSpace(c) {
		s.error(c, "after top-level value")
	}
	return scanEnd
}

func stateInString(s *scanner, c byte) int {
	switch {
	case c == '"':
		s.step = stateEndValue
	case c == '\\':
		s.step = stateInStringEsc
	case c < 0x20:
		return s.error(c, "in string literal")
	}
	return scanContinue
}

func stateInStringEsc(s *scanner, c byte) int {
	switch c {
	case 'b', 'f', 'n', 'r', 't', '\\', '/', '"':
		s.step = stateInString
		return scanContinue
	case 'u':
		s.step = stateInStringEscU
		return scanContinue
	}
	return s.error(c, "in string escape code")
}

// The four hex digits of \uXXXX.
func stateInStringEscU(s *scanner, c byte) int  { return hexDigit(s, c, stateInStringEscU1) }
func stateInStringEscU1(s *scanner, c byte) int { return hexDigit(s, c, stateInStringEscU2) }
func stateInStringEscU2(s *scanner, c byte) int { return hexDigit(s, c, stateInStringEscU3) }
func stateInStringEscU3(s *scanner, c byte) int { return hexDigit(s, c, stateInString) }

func hexDigit(s *scanner, c byte, next func(*scanner, byte) int) int {
	if isHex(c) {
		s.step = next
		return scanContinue
	}
	return s.error(c, "in \\u hexadecimal character escape")
}

func stateNeg(s *scanner, c byte) int {
	if c == '0' {
		s.step = state0
		return scanContinue
	}
	if '1' <= c && c <= '9' {
		s.step = state1
		return scanContinue
	}
	return s.error(c, "in numeric literal")
}

func state1(s *scanner, c byte) int {
	if '0' <= c && c <= '9' {
		s.step = state1
		return scanContinue
	}
	return state0(s, c)
}

func state0(s *scanner, c byte) int {
	if c == '.' {
		s.step = stateDot
		return scanContinue
	}
	if c == 'e' || c == 'E' {
		s.step = stateE
		return scanContinue
	}
	return stateEndValue(s, c)
}

func stateDot(s *scanner, c byte) int {
	if '0' <= c && c <= '9' {
		s.step = stateDot0
		return scanContinue
	}
	return s.error(c, "after decimal point in numeric literal")
}

func stateDot0(s *scanner, c byte) int {
	if '0' <= c && c <= '9' {
		return scanContinue
	}
	if c == 'e' || c == 'E' {
		s.step = stateE
		return scanContinue
	}
	return stateEndValue(s, c)
}

func stateE(s *scanner, c byte) int {
	if c == '+' || c == '-' {
		s.step = stateESign
		return scanContinue
	}
	return stateESign(s, c)
}

func stateESign(s *scanner, c byte) int {
	if '0' <= c && c <= '9' {
		s.step = stateE0
		return scanContinue
	}
	return s.error(c, "in exponent of numeric literal")
}

func stateE0(s *scanner, c byte) int {
	if '0' <= c && c <= '9' {
		return scanContinue
	}
	return stateEndValue(s, c)
}

// literal is the state after word[:i] of true, false or null.
func literal(word string, i int, done func(*scanner, byte) int) func(*scanner, byte) int {
	return func(s *scanner, c byte) int {
		if c != word[i] {
			return s.error(c, "in literal "+word+" (expecting "+quoteChar(word[i])+")")
		}
		if i+1 == len(word) {
			s.step = done
		} else {
			s.step = literal(word, i+1, done)
		}
		return scanContinue
	}
}

func stateError(*scanner, byte) int { return scanError }

func (s *scanner) error(c byte, context string) int {
	s.step = stateError
	s.err = &textError{"invalid JSON: invalid character " + quoteChar(c) + " " + context + " (at byte " + strconv.Itoa(s.bytes) + ")"}
	return scanError
}

func quoteChar(c byte) string {
	if c == '\'' {
		return `'\''`
	}
	if c == '"' {
		return `'"'`
	}
	q := strconv.Quote(string(rune(c)))
	return "'" + q[1:len(q)-1] + "'"
}
