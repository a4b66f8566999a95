package wasmsize

import "testing"

func TestPackageOf(t *testing.T) {
	for _, tc := range []struct{ fn, want string }{
		{"runtime.mallocgc", "runtime"},
		{"encoding/json.(*decodeState).value", "encoding/json"},
		{"encoding_json.(*decodeState).value", "encoding_json"},
		{"github.com_tidwall_gjson.Get", "github.com_tidwall_gjson"},
		{"github.com/tidwall/gjson.Get", "github.com/tidwall/gjson"},
		{"slices.Index[go.shape.[]string,go.shape.string]", "slices"},
		{"type:.eq.sync.Mutex", "type:"},
		{"_rt0_wasm_wasip1", "(no package)"},
		{"", "(unnamed)"},
	} {
		if got := PackageOf(tc.fn); got != tc.want {
			t.Errorf("PackageOf(%q) = %q, want %q", tc.fn, got, tc.want)
		}
	}
}

// A module with one imported function and two bodies of 2 and 3 bytes,
// named a.f and b.g, and a 5-byte data section.
func TestAnalyze(t *testing.T) {
	m := []byte("\x00asm\x01\x00\x00\x00")
	sec := func(id byte, body ...byte) { m = append(append(m, id, byte(len(body))), body...) }
	sec(1, 1, 0x60, 0, 0)                    // type () -> ()
	sec(2, 1, 1, 'e', 1, 'i', 0, 0)          // import e.i, a function of type 0
	sec(3, 2, 0, 0)                          // two functions of type 0
	sec(10, 2, 2, 0, 0x0b, 3, 0, 0x01, 0x0b) // their bodies
	sec(11, 1, 2, 3, 4, 5)                   // data (its content is not parsed)
	sec(0, 4, 'n', 'a', 'm', 'e', 1, 11, 2, 1, 3, 'a', '.', 'f', 2, 3, 'b', '.', 'g')
	rep, err := Analyze(m)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Packages["a"] != 2 || rep.Packages["b"] != 3 || rep.Data != 5 || rep.Code != 8 || rep.Total != len(m) {
		t.Errorf("Analyze = %+v", rep)
	}
	if _, err := Analyze(m[:len(m)-3]); err == nil {
		t.Error("a truncated module: no error")
	}
}
