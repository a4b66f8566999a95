package filter

import "testing"

func TestCgocheckOff(t *testing.T) {
	for _, tc := range []struct {
		godebug string
		want    bool
	}{
		{"", false},
		{"cgocheck=0", true},
		{"cgocheck=1", false},
		{"madvdontneed=1,cgocheck=0", true},
		{"cgocheck=0,cgocheck=1", false}, // the last one wins
		{"cgocheck=1, cgocheck=0", true},
		{"xcgocheck=0", false},
	} {
		if got := cgocheckOff(tc.godebug); got != tc.want {
			t.Errorf("cgocheckOff(%q) = %v, want %v", tc.godebug, got, tc.want)
		}
	}
}
