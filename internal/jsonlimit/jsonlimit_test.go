package jsonlimit

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		in       string
		max      int
		wantPath string
		wantOK   bool
	}{
		{`1`, 0, "", true},
		{`{}`, 1, "", true},
		{`{}`, 0, "", false},
		{`{"a":[1]}`, 2, "", true},
		{`{"a":[1]}`, 1, "a", false},
		{`{"rules":[{"x":1},{"match":{"header:x":{"in":[1]}}}]}`, 4, `rules[1].match["header:x"]`, false},
		{`{"a":"[[[[{{{{"}`, 1, "", true},           // brackets in strings do not count
		{`{"a\"":"x","b":[[1]]}`, 2, "b[0]", false}, // an escaped quote does not end a key
		{`[1,2,[3]]`, 1, "[2]", false},
		{`[[[[`, 3, "[0][0][0]", false}, // not JSON: still counted
		{`]]]]{`, 1, "", true},
	}
	for _, tt := range tests {
		path, ok := Check([]byte(tt.in), tt.max)
		if ok != tt.wantOK || path != tt.wantPath {
			t.Errorf("Check(%s, %d) = %q, %v; want %q, %v", tt.in, tt.max, path, ok, tt.wantPath, tt.wantOK)
		}
	}
}

func TestCheckDeep(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 100000) + "1" + strings.Repeat("}", 100000)
	path, ok := Check([]byte(deep), 32)
	if ok || path != strings.TrimSuffix(strings.Repeat("a.", 32), ".") {
		t.Fatalf("100000 deep: %q, %v", path[:min(len(path), 80)], ok)
	}
}

// FuzzCheck: the answer agrees with a plain count of the deepest open
// bracket outside strings, for any input.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":"]"}]}`, `[[["\\"]]]`, `{"x\"y":[[]]}`, `"unterminated [`} {
		f.Add([]byte(s), 2)
	}
	f.Fuzz(func(t *testing.T, data []byte, limit int) {
		if limit < 0 || limit > 64 {
			return
		}
		deepest, depth, inStr, esc := 0, 0, false, false
		for _, c := range data {
			switch {
			case inStr && esc:
				esc = false
			case inStr && c == '\\':
				esc = true
			case inStr:
				inStr = c != '"'
			case c == '"':
				inStr = true
			case c == '{' || c == '[':
				depth++
				deepest = max(deepest, depth)
			case (c == '}' || c == ']') && depth > 0:
				depth--
			}
		}
		if _, ok := Check(data, limit); ok != (deepest <= limit) {
			t.Fatalf("Check(%q, %d) = %v, but the deepest bracket is at %d", data, limit, ok, deepest)
		}
	})
}
