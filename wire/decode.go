package wire

import (
	"math"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonlimit"
)

// FieldError is a body the contract refuses. Field names the offending part
// of the JSON body ("buckets[0].burst", "body").
type FieldError struct {
	Field string
	Msg   string
}

// Error implements error.
func (e *FieldError) Error() string { return "wire: " + e.Detail() }

// Detail is the message for a client: "<field>: <what is wrong>".
func (e *FieldError) Detail() string { return e.Field + ": " + e.Msg }

func refuse(field, msg string) *FieldError { return &FieldError{Field: field, Msg: msg} }

// maxDepth bounds a body's nesting before gjson sees it: every body of the
// contract has at most 3 levels.
const maxDepth = 8

// parse checks that body is one JSON object of bounded size and nesting and
// returns it.
func parse(body []byte, maxBytes int64) (gjson.Result, *FieldError) {
	if int64(len(body)) > maxBytes {
		return gjson.Result{}, refuse("body", "larger than "+strconv.FormatInt(maxBytes, 10)+" bytes")
	}
	if path, ok := jsonlimit.Check(body, maxDepth); !ok {
		if path == "" {
			path = "body"
		}
		return gjson.Result{}, refuse(path, "nested deeper than "+strconv.Itoa(maxDepth)+" levels")
	}
	if !gjson.ValidBytes(body) {
		return gjson.Result{}, refuse("body", jsonlimit.SyntaxError(body).Error())
	}
	v := gjson.ParseBytes(body)
	if !v.IsObject() {
		return gjson.Result{}, refuse("body", "must be an object, got "+jsonlimit.Kind(v))
	}
	return v, nil
}

// fields walks object v (at field path at) and hands each member to set,
// refusing members not in names, duplicates, and a v that is not an object.
// A null member is absent.
func fields(at string, v gjson.Result, names []string, set func(i int, v gjson.Result) *FieldError) *FieldError {
	if !v.IsObject() {
		return refuse(at, "must be an object, got "+jsonlimit.Kind(v))
	}
	var seen uint32
	var err *FieldError
	v.ForEach(func(k, m gjson.Result) bool {
		i := index(names, k.Str)
		path := join(at, k.Str)
		switch {
		case i < 0:
			err = refuse(path, "unknown field")
		case seen&(1<<i) != 0:
			err = refuse(path, "duplicate field")
		case m.Type != gjson.Null:
			seen |= 1 << i
			err = set(i, m)
		}
		return err == nil
	})
	return err
}

func index(names []string, s string) int {
	for i, n := range names {
		if n == s {
			return i
		}
	}
	return -1
}

func join(at, name string) string {
	if at == "" {
		return name
	}
	return at + "." + name
}

// number reads a finite number.
func number(at string, v gjson.Result) (float64, *FieldError) {
	if v.Type != gjson.Number {
		return 0, refuse(at, "must be a number, got "+jsonlimit.Kind(v))
	}
	if math.IsInf(v.Num, 0) || math.IsNaN(v.Num) {
		return 0, refuse(at, "must be a finite number, got "+v.Raw)
	}
	return v.Num, nil
}

// text reads a string.
func text(at string, v gjson.Result) (string, *FieldError) {
	if v.Type != gjson.String {
		return "", refuse(at, "must be a string, got "+jsonlimit.Kind(v))
	}
	return v.Str, nil
}

// boolean reads true or false.
func boolean(at string, v gjson.Result) (bool, *FieldError) {
	if v.Type != gjson.True && v.Type != gjson.False {
		return false, refuse(at, "must be a boolean, got "+jsonlimit.Kind(v))
	}
	return v.Type == gjson.True, nil
}

// array reads an array of at most max elements, refusing an empty one.
func array(at string, v gjson.Result, max int) ([]gjson.Result, *FieldError) {
	if !v.IsArray() {
		return nil, refuse(at, "must be an array, got "+jsonlimit.Kind(v))
	}
	a := v.Array()
	if len(a) == 0 || len(a) > max {
		return nil, refuse(at, "must hold 1 to "+strconv.Itoa(max)+" buckets, got "+strconv.Itoa(len(a)))
	}
	return a, nil
}

// between refuses x outside [lo, hi], naming the bounds.
func between(at string, x, lo, hi float64, loOpen bool) *FieldError {
	if (loOpen && x > lo || !loOpen && x >= lo) && x <= hi {
		return nil
	}
	op := ">="
	if loOpen {
		op = ">"
	}
	return refuse(at, "must be "+op+" "+fmtFloat(lo)+" and <= "+fmtFloat(hi)+", got "+fmtFloat(x))
}

func fmtFloat(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// appendFloat writes x so that strconv.ParseFloat (and gjson, and Lua's
// tonumber) read back the same float64.
func appendFloat(b []byte, x float64) []byte { return strconv.AppendFloat(b, x, 'g', -1, 64) }

// appendString writes s as a JSON string: quotes, backslashes and control
// bytes escaped, everything else as it is (the plugin's keys are ASCII: rule
// names and hex).
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
