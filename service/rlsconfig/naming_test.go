package rlsconfig

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Token-bucket names are unambiguous: descriptors that differ have
// different names, whatever their values hold; fixed windows keep
// envoyproxy/ratelimit's names.
func TestNames(t *testing.T) {
	var n Naming
	for _, tc := range []struct {
		domain  string
		entries []Entry
		bucket  string
		window  string
	}{
		{"apis", []Entry{{"generic_key", "slow"}}, "4:apis_11:generic_key_4:slow", "apis_generic_key_slow_60"},
		{"d", []Entry{{"user", "victim_path_/x"}}, "1:d_4:user_14:victim_path_/x", "d_user_victim_path_/x_60"},
		{"d", []Entry{{"user", "victim"}, {"path", "/x"}}, "1:d_4:user_6:victim_4:path_2:/x", "d_user_victim_path_/x_60"},
		{"d", []Entry{{"k", ""}}, "1:d_1:k_0:", "d_k__60"},
	} {
		if got := n.BucketKey(tc.domain, tc.entries, nil); got != tc.bucket {
			t.Errorf("BucketKey(%q, %v) = %q, want %q", tc.domain, tc.entries, got, tc.bucket)
		}
		if got := n.WindowKey(tc.domain, tc.entries, nil, 60); got != tc.window {
			t.Errorf("WindowKey(%q, %v) = %q, want %q", tc.domain, tc.entries, got, tc.window)
		}
	}
	// Values given apart name the entries in their place.
	if got := n.BucketKey("d", []Entry{{"k", "v"}}, []string{"w*"}); got != "1:d_1:k_2:w*" {
		t.Errorf("with values: %q", got)
	}
	if got := (Naming{WindowPrefix: "p:"}).WindowKey("d", []Entry{{"k", "v"}}, nil, 7); got != "p:d_k_v_7" {
		t.Errorf("with a prefix: %q", got)
	}
}

// Past MaxKeyBytes a name is hashed: bounded, its domain kept where it
// fits, and different for different descriptors.
func TestLongNamesHashed(t *testing.T) {
	n := Naming{MaxKeyBytes: 64}
	long := strings.Repeat("v", 60_000)
	a := n.BucketKey("d", []Entry{{"user", long}}, nil)
	b := n.BucketKey("d", []Entry{{"user", long + "w"}}, nil)
	if a == b || len(a) > 64 || !strings.HasPrefix(a, "1:d#") {
		t.Errorf("hashed names %q and %q", a, b)
	}
	if got := n.BucketKey(strings.Repeat("D", 40), []Entry{{"user", long}}, nil); len(got) != 33 || got[0] != '#' {
		t.Errorf("a domain that does not fit: %q", got)
	}
	w := n.WindowKey("d", []Entry{{"user", long}}, nil, 60)
	if !strings.HasPrefix(w, "d_#") || !strings.HasSuffix(w, "_60") || len(w) != len("d_#_60")+32 {
		t.Errorf("hashed window %q", w)
	}
	for _, s := range []string{strings.Repeat("é", 100), "ok\xff", long} {
		l := n.Label(s)
		if len(l) > 64 || !utf8.ValidString(l) || l == n.Label(s+"x") {
			t.Errorf("Label(%.20q...) = %q", s, l)
		}
	}
	if got := n.Label("d.user_x"); got != "d.user_x" {
		t.Errorf("a short label: %q", got)
	}
	if got := InvalidUTF8("\xff"); !utf8.ValidString(got) || got == InvalidUTF8("\xfe") {
		t.Errorf("InvalidUTF8: %q", got)
	}
}

// FuzzBucketKeyUnambiguous: two descriptors have one name only if they are
// the same descriptor.
func FuzzBucketKeyUnambiguous(f *testing.F) {
	f.Add("d", "user", "victim_path_/x", "", "", "d", "user", "victim", "path", "/x")
	f.Add("1:d", "k", "v", "", "", "1", "d_1:k", "v", "", "")
	f.Fuzz(func(t *testing.T, d1, k1, v1, k2, v2, d2, k3, v3, k4, v4 string) {
		entries := func(k, v, k2, v2 string) []Entry {
			e := []Entry{{k, v}}
			if k2 != "" || v2 != "" {
				e = append(e, Entry{k2, v2})
			}
			return e
		}
		e1, e2 := entries(k1, v1, k2, v2), entries(k3, v3, k4, v4)
		same := d1 == d2 && len(e1) == len(e2)
		for i := range e1 {
			same = same && i < len(e2) && e1[i] == e2[i]
		}
		n := Naming{MaxKeyBytes: 1 << 20}
		if a, b := n.BucketKey(d1, e1, nil), n.BucketKey(d2, e2, nil); (a == b) != same {
			t.Fatalf("%q %v and %q %v: names %q, %q", d1, e1, d2, e2, a, b)
		}
	})
}
