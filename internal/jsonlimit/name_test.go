package jsonlimit

import (
	"regexp"
	"testing"
)

// simpleName is the regexp it replaced.
func TestSimpleNameMatchesPattern(t *testing.T) {
	pattern := regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	check := func(s string) {
		if got, want := simpleName(s), pattern.MatchString(s); got != want {
			t.Errorf("simpleName(%q) = %v, want %v", s, got, want)
		}
	}
	for _, s := range []string{"", "a", "_", "9", "a9", "rules", "header:x", "a.b", "a b", "a\n"} {
		check(s)
	}
	for c := 0; c < 256; c++ {
		check(string([]byte{byte(c)}))
		check("x" + string([]byte{byte(c)}))
		check(string([]byte{byte(c)}) + "x")
	}
}
