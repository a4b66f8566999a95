package config

import (
	"regexp"
	"strings"
	"testing"
)

// validName is the regexp it replaced.
func TestValidNameMatchesPattern(t *testing.T) {
	pattern := regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	check := func(s string) {
		if got, want := validName(s), pattern.MatchString(s); got != want {
			t.Errorf("validName(%q) = %v, want %v", s, got, want)
		}
	}
	for _, s := range []string{"", "a", "A.b-c_9", strings.Repeat("a", 64), strings.Repeat("a", 65), "a b", "a\n", "é", "a/b", "a:b"} {
		check(s)
	}
	for c := 0; c < 256; c++ {
		check(string(rune(c)))
		check("x" + string([]byte{byte(c)}))
	}
}
