package jsonlimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// wantSyntaxError is what syntaxError said with encoding/json.
func wantSyntaxError(data []byte) string {
	var v any
	var se *json.SyntaxError
	if err := json.Unmarshal(data, &v); errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON: %s (at byte %d)", se.Error(), se.Offset)
	}
	return "invalid JSON"
}

var syntaxCases = []string{
	``, ` `, `{`, `{"rules":`, `{} {}`, `{}x`, `{} `, `{"rules":[],}`, `[1,]`, `[1 2]`, `{"a" 1}`, `{"a":1 "b"}`,
	`{1:2}`, `"abc`, "\"a\x01\"", `"\x"`, `"\u12G4"`, `"\u"`, `-`, `-a`, `01`, `1.`, `1.e5`, `1e`, `1e+`, `1ex`,
	`tru`, `trux`, `fals`, `falsy`, `nul`, `nulx`, `nil`, `'a'`, `"a"'`, "\u00e9", `[`, `[[]`, `]`, `}`, `{"a":}`,
	`{"a":[}`, `123`, `123 `, `-0.5e-3`, `[1,2,3]`, `{"a":{"b":[true,false,null]}}`, `{"a":"\"\\\/\b\f\n\r\t\u00e9"}`,
	`{"a":1}}`, `[1]]`, "\t\r\n{}", `{"a":1,}`, `{,}`, `[,]`, `"\`, `"\u00`, `1e400`, `{"a":1e400}`,
	strings.Repeat("[", 40) + strings.Repeat("]", 39),
}

func TestSyntaxErrorMatchesEncodingJSON(t *testing.T) {
	for _, in := range syntaxCases {
		if got, want := SyntaxError([]byte(in)).Error(), wantSyntaxError([]byte(in)); got != want {
			t.Errorf("SyntaxError(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzSyntaxError(f *testing.F) {
	for _, in := range syntaxCases {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if got, want := SyntaxError(in).Error(), wantSyntaxError(in); got != want {
			t.Errorf("SyntaxError(%q) = %q, want %q", in, got, want)
		}
	})
}
