package wire

import (
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
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

// refuse is the refusal of the value at field path field. Decoders work
// with the reading layer's errors and turn them into a *FieldError at their
// edge (refusal).
func refuse(field, msg string) *jsonfield.Error { return jsonfield.Refuse(field, msg) }

// refusal is e as a *FieldError, the body as a whole named "body"; nil when
// e is nil. Out of line, as jsonfield.Refuse says why.
//
//go:noinline
func refusal(e *jsonfield.Error) error {
	switch {
	case e == nil:
		return nil
	case e.Path == "":
		return &FieldError{Field: "body", Msg: e.Msg}
	}
	return &FieldError{Field: e.Path, Msg: e.Msg}
}

// maxDepth bounds a body's nesting before gjson sees it: every body of the
// contract has at most 3 levels.
const maxDepth = 8

// parse checks that body is one JSON object of bounded size and nesting and
// returns it.
func parse(body []byte, maxBytes int64) (gjson.Result, *jsonfield.Error) {
	if int64(len(body)) > maxBytes {
		return gjson.Result{}, refuse("body", "larger than "+strconv.FormatInt(maxBytes, 10)+" bytes")
	}
	v, err := jsonfield.Parse(body, maxDepth)
	if err != nil {
		return gjson.Result{}, err
	}
	if !v.IsObject() {
		return gjson.Result{}, refuse("body", "must be an object, got "+jsonfield.Kind(v))
	}
	return v, nil
}

// fields walks object v (at field path at) and hands each member, with its
// path, to set,
// refusing members not in names, duplicates, and a v that is not an object.
// A null member is absent.
func fields(at string, v gjson.Result, names []string, set func(i int, at string, v gjson.Result) *jsonfield.Error) *jsonfield.Error {
	var seen uint32
	return jsonfield.Members(at, v, func(name, path string, m gjson.Result) *jsonfield.Error {
		i := index(names, name)
		switch {
		case i < 0:
			return refuse(path, "unknown field")
		case seen&(1<<i) != 0:
			return refuse(path, "duplicate field")
		case m.Type != gjson.Null:
			seen |= 1 << i
			return set(i, path, m)
		}
		return nil
	})
}

func index(names []string, s string) int {
	for i, n := range names {
		if n == s {
			return i
		}
	}
	return -1
}

// array reads an array of at most max elements, refusing an empty one.
func array(at string, v gjson.Result, max int) ([]gjson.Result, *jsonfield.Error) {
	a, err := jsonfield.Array(at, v)
	if err != nil {
		return nil, err
	}
	if len(a) == 0 || len(a) > max {
		return nil, refuse(at, "must hold 1 to "+strconv.Itoa(max)+" buckets, got "+strconv.Itoa(len(a)))
	}
	return a, nil
}

// between refuses x outside [lo, hi], naming the bounds.
func between(at string, x, lo, hi float64, loOpen bool) *jsonfield.Error {
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
