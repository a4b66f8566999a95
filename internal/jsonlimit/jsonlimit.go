// Package jsonlimit bounds the nesting of JSON before a recursive parser
// (gjson's validator and getters) sees it. A parser that recurses once per
// level runs out of stack on input nested a few thousand deep, and inside a
// Wasm VM that ends the VM; Check costs one pass over the bytes and no
// recursion, so any input, valid JSON or not, is safe to give it.
package jsonlimit

import (
	"strconv"
)

// frame is one open array or object during the scan.
type frame struct {
	array    bool
	index    int // arrays: elements before the current one
	key      []byte
	wantsKey bool // objects: the next string is a key
}

// Check reports whether no value of data is nested deeper than maxDepth
// (the top-level value is at depth 1: {"a":[1]} has depth 2). When one is, it
// returns false and the JSON path of the first such value, in the form
// package config uses for its errors (rules[0].match["header:x"]); an empty
// path is the document itself. Brackets inside strings do not count. Data
// need not be valid JSON: Check only counts.
func Check(data []byte, maxDepth int) (path string, ok bool) {
	var stack []frame
	inString, escaped := false, false
	strStart := 0
	for i := 0; i < len(data); i++ {
		c := data[i]
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
				if n := len(stack); n > 0 && !stack[n-1].array && stack[n-1].wantsKey {
					stack[n-1].key = data[strStart:i]
					stack[n-1].wantsKey = false
				}
			}
			continue
		}
		switch c {
		case '"':
			inString, strStart = true, i+1
		case '{', '[':
			if len(stack) >= maxDepth {
				return pathOf(stack), false
			}
			stack = append(stack, frame{array: c == '[', wantsKey: c == '{'})
		case '}', ']':
			if n := len(stack); n > 0 {
				stack = stack[:n-1]
			}
		case ',':
			if n := len(stack); n > 0 {
				if stack[n-1].array {
					stack[n-1].index++
				} else {
					stack[n-1].wantsKey = true
				}
			}
		}
	}
	return "", true
}

func pathOf(stack []frame) string {
	path := ""
	for _, f := range stack {
		if f.array {
			path += "[" + strconv.Itoa(f.index) + "]"
		} else {
			path = Join(path, string(f.key))
		}
	}
	return path
}

// simpleName reports whether name is written a.name in a path: the regexp
// ^[A-Za-z_][A-Za-z0-9_]*$, written out so every VM does not compile it at
// start.
func simpleName(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || c == '_' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return name != ""
}

// Join appends a field name to a JSON path: a.b for plain names,
// a["header:x-plan"] for any other.
func Join(path, name string) string {
	if simpleName(name) {
		if path == "" {
			return name
		}
		return path + "." + name
	}
	return path + "[" + strconv.Quote(name) + "]"
}
