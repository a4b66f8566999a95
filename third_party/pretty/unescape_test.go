package pretty

import (
	"encoding/json"
	"testing"
)

// unescape decodes as encoding/json's Unmarshal into a string did.
func FuzzUnescape(f *testing.F) {
	for _, s := range []string{`"a"`, `"a\"b"`, `"\u00e9\n\t\/"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83dx"`, `"\x"`, `"\u12"`, `"a`, "\"\xff\"", `"\ud83d\u0041"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, s []byte) {
		var want string
		json.Unmarshal(s, &want)
		if got := string(unescape(s)); got != want {
			t.Errorf("unescape(%q) = %q, want %q", s, got, want)
		}
	})
}
