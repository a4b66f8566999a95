// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package loopback

import "testing"

// TestFreePortNeverRepeats: the kernel may hand one ephemeral port out twice
// in a row; FreePort must not (two listeners of one Envoy got the same port).
func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 500 {
		p, err := FreePort()
		if err != nil || seen[p] {
			t.Fatalf("FreePort() = %d, %v; seen before: %v", p, err, seen[p])
		}
		seen[p] = true
	}
}
