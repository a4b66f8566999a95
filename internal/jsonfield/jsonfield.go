// Package jsonfield is the one JSON reading layer of package config (the
// plugin's configuration) and package wire (the bodies the plugin and the
// limit service exchange). It parses a document once its nesting is bounded
// (package jsonlimit), walks an object's members in document order, and
// reads typed values, each refusal an *Error naming the value's JSON path in
// the form jsonlimit.Join writes (rules[0].match["header:x"].regex).
//
// The layer holds the mechanism and the wording both packages share (what a
// type error says, how a path is written); each package keeps its own
// policy on top: which fields exist, defaults, bounds, and whether a null
// member counts as absent (wire) or as a value of the wrong type (config).
// Nothing here panics on any input, and nothing recurses deeper than the
// nesting bound Parse was given.
package jsonfield

import (
	"math"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonlimit"
)

// Error is a value the reader refuses: its JSON path (empty for the document
// as a whole) and what is wrong with it.
type Error struct {
	Path string
	Msg  string
}

// Error implements error: "<path>: <msg>", or "<msg>" for the document.
func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Refuse is the *Error at path saying msg.
//
// Refusals are the cold path, and their constructors (Refuse, TypeError,
// and the packages' conversions of an *Error) stay out of line: inlined
// into every getter and every caller of a getter they made the plugin's
// Wasm module about 10 KB larger.
//
//go:noinline
func Refuse(path, msg string) *Error { return &Error{Path: path, Msg: msg} }

// Parse bounds data's nesting to maxDepth, checks that it is valid JSON and
// returns its top-level value. A document nested too deep is refused at the
// path of its first too-deep value ("" for the document itself); invalid
// JSON at path "", saying where and why (jsonlimit.SyntaxError).
func Parse(data []byte, maxDepth int) (gjson.Result, *Error) {
	// gjson's validator recurses once per level: bound the nesting first.
	if path, ok := jsonlimit.Check(data, maxDepth); !ok {
		return gjson.Result{}, Refuse(path, "nested deeper than "+strconv.Itoa(maxDepth)+" levels")
	}
	if !gjson.ValidBytes(data) {
		return gjson.Result{}, Refuse("", jsonlimit.SyntaxError(data).Error())
	}
	return gjson.ParseBytes(data), nil
}

// Kind names v's JSON type for error messages: null, boolean, number,
// string, array or object.
func Kind(v gjson.Result) string {
	switch v.Type {
	case gjson.Null:
		return "null"
	case gjson.False, gjson.True:
		return "boolean"
	case gjson.Number:
		return "number"
	case gjson.String:
		return "string"
	}
	if v.IsArray() {
		return "array"
	}
	return "object"
}

// TypeError refuses v at path for not being want ("a string", "an
// integer"): "must be <want>, got <kind>".
//
//go:noinline
func TypeError(path, want string, v gjson.Result) *Error {
	return Refuse(path, "must be "+want+", got "+Kind(v))
}

// Members calls each with every member of the object v, in document order,
// with the member's name and path, until one returns an error, which
// Members returns. A v that is not an object is refused. Duplicate names
// are each's to judge: JSON allows them, this project's documents do not.
func Members(path string, v gjson.Result, each func(name, at string, value gjson.Result) *Error) *Error {
	if !v.IsObject() {
		return TypeError(path, "an object", v)
	}
	var err *Error
	v.ForEach(func(k, m gjson.Result) bool {
		err = each(k.Str, jsonlimit.Join(path, k.Str), m)
		return err == nil
	})
	return err
}

// Elem is the path of element i of the array at path: path[i].
func Elem(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// Array returns the elements of the array v.
func Array(path string, v gjson.Result) ([]gjson.Result, *Error) {
	if !v.IsArray() {
		return nil, TypeError(path, "an array", v)
	}
	return v.Array(), nil
}

// String returns the string v, any string, the empty one included.
func String(path string, v gjson.Result) (string, *Error) {
	if v.Type != gjson.String {
		return "", TypeError(path, "a string", v)
	}
	return v.Str, nil
}

// Bool returns the boolean v.
func Bool(path string, v gjson.Result) (bool, *Error) {
	if v.Type != gjson.True && v.Type != gjson.False {
		return false, TypeError(path, "a boolean", v)
	}
	return v.Type == gjson.True, nil
}

// Number returns the number v, which must be finite as a float64 (a
// literal such as 1e999 is refused, showing its text).
func Number(path string, v gjson.Result) (float64, *Error) {
	if v.Type != gjson.Number {
		return 0, TypeError(path, "a number", v)
	}
	if math.IsInf(v.Num, 0) || math.IsNaN(v.Num) {
		return 0, Refuse(path, "must be a finite number, got "+v.Raw)
	}
	return v.Num, nil
}
