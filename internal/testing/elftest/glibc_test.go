// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package elftest

import "testing"

// TestCompareVersions: numeric, not textual, and a missing part is 0.
func TestCompareVersions(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{{"2.34", "2.34", 0}, {"2.4", "2.34", -1}, {"2.35", "2.34", 1}, {"2.3.2", "2.3", 1}, {"2.3", "2.3.0", 0}, {"", "2.2.5", -1}, {"", "", 0}} {
		if got := CompareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
