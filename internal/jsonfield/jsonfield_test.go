package jsonfield

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in, wantErr string
	}{
		{`{"a":[1]}`, ""},
		{`3`, ""},
		{`{"a":[[1]]}`, "a[0]: nested deeper than 2 levels"},
		{`[[[`, "[0][0]: nested deeper than 2 levels"},
		{`{"a":}`, "invalid JSON: invalid character '}' looking for beginning of value (at byte 6)"},
		{``, "invalid JSON: unexpected end of JSON input (at byte 0)"},
		{`{} {}`, "invalid JSON: invalid character '{' after top-level value (at byte 4)"},
	}
	for _, tt := range tests {
		v, err := Parse([]byte(tt.in), 2)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("Parse(%s) = %v", tt.in, err)
		case tt.wantErr == "" && v.Raw != tt.in:
			t.Errorf("Parse(%s) = %s", tt.in, v.Raw)
		case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
			t.Errorf("Parse(%s) = %v, want %s", tt.in, err, tt.wantErr)
		}
	}
}

func TestTypedGetters(t *testing.T) {
	get := func(s string) gjson.Result { return gjson.Parse(s) }
	check := func(what string, err *Error, want string) {
		t.Helper()
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != want {
			t.Errorf("%s: %q, want %q", what, got, want)
		}
	}
	s, err := String("a", get(`"x"`))
	check("String", err, "")
	if s != "x" {
		t.Errorf("String = %q", s)
	}
	_, err = String("a", get(`1`))
	check("String(1)", err, "a: must be a string, got number")
	b, err := Bool("a.b", get(`true`))
	check("Bool", err, "")
	if !b {
		t.Error("Bool(true) = false")
	}
	_, err = Bool("a.b", get(`null`))
	check("Bool(null)", err, "a.b: must be a boolean, got null")
	n, err := Number("x", get(`-2.5`))
	check("Number", err, "")
	if n != -2.5 {
		t.Errorf("Number = %v", n)
	}
	_, err = Number("x", get(`1e999`))
	check("Number(1e999)", err, "x: must be a finite number, got 1e999")
	_, err = Number("x", get(`{}`))
	check("Number({})", err, "x: must be a number, got object")
	a, err := Array("l", get(`[1,"a"]`))
	check("Array", err, "")
	if len(a) != 2 {
		t.Errorf("Array = %v", a)
	}
	_, err = Array("l", get(`"[]"`))
	check("Array(string)", err, "l: must be an array, got string")
	for in, want := range map[string]string{`null`: "null", `false`: "boolean", `0`: "number", `""`: "string", `[]`: "array", `{}`: "object"} {
		if got := Kind(get(in)); got != want {
			t.Errorf("Kind(%s) = %s, want %s", in, got, want)
		}
	}
	if got := Elem(Elem("rules", 3), 0); got != "rules[3][0]" {
		t.Errorf("Elem = %s", got)
	}
}

func TestMembers(t *testing.T) {
	var seen []string
	err := Members("rules[0].match", gjson.Parse(`{"header:x":1,"b":2,"b":3,"c":4}`), func(name, at string, v gjson.Result) *Error {
		seen = append(seen, name+"="+at+"="+v.Raw)
		if v.Raw == "3" {
			return Refuse(at, "stop here")
		}
		return nil
	})
	want := []string{`header:x=rules[0].match["header:x"]=1`, `b=rules[0].match.b=2`, `b=rules[0].match.b=3`}
	if strings.Join(seen, " ") != strings.Join(want, " ") {
		t.Errorf("walked %q, want %q (document order, duplicates included, stopping at the first error)", seen, want)
	}
	if err == nil || err.Error() != "rules[0].match.b: stop here" {
		t.Errorf("Members = %v", err)
	}
	err = Members("", gjson.Parse(`[1]`), func(string, string, gjson.Result) *Error { t.Fatal("called"); return nil })
	if err == nil || err.Error() != "must be an object, got array" {
		t.Errorf("Members([1]) = %v", err)
	}
}

// FuzzParse checks that any input is safe to give Parse, and that what it
// accepts is what encoding/json accepts (for documents within the bound).
func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":null}]}`, `[[[[[[[[[`, `"\ud800"`, `{"a":1}x`, `1e999`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Parse(data, 4)
		if err != nil {
			if strings.HasSuffix(err.Msg, "nested deeper than 4 levels") {
				return
			}
			if !strings.HasPrefix(err.Msg, "invalid JSON: ") || err.Path != "" {
				t.Fatalf("Parse(%q) = %v", data, err)
			}
		}
		if utf8.Valid(data) && (err == nil) != json.Valid(data) {
			t.Fatalf("Parse(%q) = %v, but json.Valid = %v", data, err, json.Valid(data))
		}
		if err == nil && v.IsObject() {
			_ = Members("", v, func(name, at string, m gjson.Result) *Error {
				if at == "" {
					t.Fatalf("member %q of %q has no path", name, data)
				}
				return nil
			})
		}
	})
}
