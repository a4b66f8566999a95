package jsonlimit

import "github.com/tidwall/gjson"

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
